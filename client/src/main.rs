use clap::Parser;

fn main() -> std::process::ExitCode {
    oscontent::cli::init_tracing();
    std::process::ExitCode::from(oscontent::cli::run(oscontent::cli::Cli::parse()))
}
