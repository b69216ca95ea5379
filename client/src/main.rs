fn main() -> std::process::ExitCode {
    oscontent::cli::init_tracing();
    let code = match oscontent::cli::parse(std::env::args_os()) {
        Ok(cli) => oscontent::cli::run(cli),
        Err(code) => code,
    };
    std::process::ExitCode::from(code)
}
