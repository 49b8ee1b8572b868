use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = switchyard::cli::Cli::parse();
    match switchyard::commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
