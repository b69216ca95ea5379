use clap::Parser;

// Per-request buffers, headers and futures are many small, short-lived
// allocations across threads, which mimalloc's thread-local free lists
// serve with less work than glibc's arenas.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = oscontent_server::cli::Cli::parse();
    let format = cli.log_format;
    oscontent_server::cli::init_tracing(format);
    match oscontent_server::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            oscontent_server::cli::report_fatal(format, &e);
            std::process::ExitCode::FAILURE
        }
    }
}
