use clap::Parser;

fn main() -> std::process::ExitCode {
    oscontent::cli::init_tracing();
    match oscontent::cli::run(oscontent::cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
