//! `switchyard report`: the error report, as text or JSON.

use super::CommandError;
use super::args::ReportArgs;
use super::backend::{Access, Backend};
use super::table::to_json;
use crate::config::Config;

pub(super) async fn report(config: &Config, args: ReportArgs) -> Result<(), CommandError> {
    let windows = report_windows(&args.windows)?;
    let backend = Backend::connect(config, Access::Read).await?;
    let slow_ms = crate::base::duration::whole_ms(args.slow);
    let result = backend.report(windows, slow_ms).await;
    backend.close().await?;
    let r = result?;
    if args.format == "json" {
        println!("{}", to_json(&r));
    } else {
        print!("{}", switchyard_admin::report::render_text(&r));
    }
    Ok(())
}

/// The report's windows in whole minutes (default 20 and 60).
pub(super) fn report_windows(given: &[std::time::Duration]) -> Result<Vec<u64>, CommandError> {
    if given.is_empty() {
        return Ok(crate::telemetry::windows::WINDOWS.to_vec());
    }
    given
        .iter()
        .map(|d| {
            let m = d.as_secs() / 60;
            if d.as_secs() % 60 != 0 || !(1..=10_080).contains(&m) {
                Err(CommandError::Usage(format!(
                    "--window {}: a whole number of minutes, from 1m to 7d",
                    humantime::format_duration(*d)
                )))
            } else {
                Ok(m)
            }
        })
        .collect()
}
