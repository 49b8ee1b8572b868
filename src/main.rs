use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = switchyard::cli::Cli::parse();
    match switchyard::cli::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[global_allocator]
static GLOBAL: switchyard_alloc::Alloc = switchyard_alloc::Alloc;
