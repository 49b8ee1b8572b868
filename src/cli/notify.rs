//! `switchyard notify`: send a test message to the configured targets, and seal a target's
//! secret for the config file.

use super::CommandError;
use super::args::NotifyCommand;
use crate::config::Config;
use crate::notify::{self, Event, EventKind};
use crate::store::secrets::{Sealer, load_or_create_key};

pub(super) async fn notify(config: &Config, cmd: NotifyCommand) -> Result<(), CommandError> {
    match cmd {
        NotifyCommand::Seal { file } => {
            let plain = super::read_secret(&file, "notify seal")?;
            let dir = super::state_dir(config);
            crate::store::ensure_writable_dir(&dir)?;
            let key = load_or_create_key(&dir, true)?;
            let sealed =
                notify::seal(&Sealer::from_key(&key), &plain).map_err(CommandError::Usage)?;
            println!("{sealed}");
            Ok(())
        }
        NotifyCommand::Test { target } => test(config, target.as_deref()).await,
    }
}

/// One test message to each target (or the one named), one try each: what each answered.
async fn test(config: &Config, only: Option<&str>) -> Result<(), CommandError> {
    let mut targets = config.notify.clone();
    if targets.is_empty() {
        return Err(CommandError::Usage(
            "no [[notify]] targets in the configuration".into(),
        ));
    }
    let names = notify::names(&targets);
    if let Some(only) = only
        && !names.iter().any(|n| n == only)
    {
        return Err(CommandError::Usage(format!(
            "no notify target {only:?}; the targets are {}",
            names.join(", ")
        )));
    }
    if targets.iter().any(|t| {
        [&t.secret, &t.token, &t.bot_token].iter().any(|s| {
            s.as_ref()
                .is_some_and(|s| s.expose().starts_with(notify::SEALED))
        })
    }) {
        let key = load_or_create_key(&super::state_dir(config), false)?;
        notify::open_sealed(&mut targets, &Sealer::from_key(&key)).map_err(CommandError::Usage)?;
    }
    let client = notify::deliver::client();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, crate::base::duration::whole_ms);
    let event = Event::new(
        EventKind::Test,
        now,
        "A test message from switchyard: this target is reached.",
    );
    let mut failed = Vec::new();
    for (t, name) in targets.iter().zip(&names) {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        match notify::deliver::send_once(&client, t, &event).await {
            Ok(()) => println!("{name} ({}): delivered", t.kind.as_str()),
            Err(why) => {
                println!("{name} ({}): not delivered: {why}", t.kind.as_str());
                failed.push(name.clone());
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CommandError::Usage(format!(
            "not delivered to {}",
            failed.join(", ")
        )))
    }
}
