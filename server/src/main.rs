use clap::Parser;

// Per-request buffers, headers and futures are many small, short-lived
// allocations across threads, which mimalloc's thread-local free lists
// serve with less work than glibc's arenas.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = oscontent_server::cli::Cli::parse();
    oscontent_server::cli::init_tracing(cli.log_format);
    match oscontent_server::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
