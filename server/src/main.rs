use clap::Parser;

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
