//! The demo's fault injector: it keeps incidents coming after the scripted faults of
//! [`super::Profile::Demo`] have played out (a short quota on a healthy account that then
//! recovers, WebSocket closes mid-turn, extra bursts), and rolls over the 5-hour windows the
//! traffic has filled, so a console watching the demo never goes quiet.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Fault, FaultKind, Sim};
use crate::base::job::Ticker;

/// When the injector first acts (the scripted faults show before), and how often after that
/// (it cycles through [`INJECTIONS`] steps).
pub const INJECT_FIRST: Duration = Duration::from_secs(5);
pub const INJECT_EVERY: Duration = Duration::from_secs(10);

/// One step of the injector's cycle: which account gets which fault.
pub struct Injection {
    /// Index into [`Sim::account_ids`]: 0 is `sim-acct-1`.
    pub account: usize,
    pub kind: FaultKind,
    pub times: u32,
}

/// The injector's cycle (a minute), one step every [`INJECT_EVERY`]. Quotas go to the healthy
/// accounts, `sim-acct-4` and `sim-acct-5`, in turn: they cool with a countdown and come back,
/// and a quota does not climb a ladder. Drops (`sim-acct-3`) and bursts (`sim-acct-2`) go to
/// the accounts whose profile already has them, so the healthy ones stay healthy and the pool
/// never runs dry.
pub fn injections() -> [Injection; INJECTIONS] {
    [
        Injection {
            account: 3,
            kind: FaultKind::Quota {
                resets_in_seconds: 40,
            },
            times: 1,
        },
        Injection {
            account: 2,
            kind: FaultKind::WsCloseMidTurn { after_deltas: 2 },
            times: 1,
        },
        Injection {
            account: 1,
            kind: FaultKind::Burst429 {
                retry_after_secs: 4,
            },
            times: 2,
        },
        Injection {
            account: 4,
            kind: FaultKind::Quota {
                resets_in_seconds: 40,
            },
            times: 1,
        },
        Injection {
            account: 2,
            kind: FaultKind::ResetMidStream { after_deltas: 4 },
            times: 1,
        },
        Injection {
            account: 1,
            kind: FaultKind::Burst429 {
                retry_after_secs: 4,
            },
            times: 1,
        },
    ]
}

/// Steps in [`injections`].
pub const INJECTIONS: usize = 6;

/// Usage at which the injector rolls an account's 5-hour window over (the profile adds usage
/// with every turn, and without this every bar would sit at the top after a few minutes). An
/// account out of quota shows 100 % and is left alone.
const ROLL_OVER_AT: std::ops::Range<f64> = 90.0..99.5;

/// Keeps incidents coming. A fault is queued only on an account with nothing queued, so an
/// account that is out (and so gets no requests) does not pile them up.
pub async fn inject_faults(sim: Sim, stop: CancellationToken) {
    let ids = sim.account_ids();
    let steps = injections();
    let mut ticker = Ticker::first_after(INJECT_FIRST, INJECT_EVERY, stop);
    for step in steps.iter().cycle() {
        if !ticker.tick().await {
            return;
        }
        let Some(id) = ids.get(step.account) else {
            continue;
        };
        if sim.faults(id).is_empty() {
            tracing::debug!(account = %id, fault = ?step.kind, "demo: injecting a fault");
            sim.push_fault(id, Fault::times(step.kind.clone(), step.times));
        }
        for id in &ids {
            if let Some((primary, secondary)) = sim.usage(id)
                && ROLL_OVER_AT.contains(&primary)
            {
                let fresh = 5.0 + (primary * 7.0) % 15.0;
                tracing::debug!(account = %id, primary, fresh, "demo: usage window rolls over");
                sim.set_usage(id, fresh, secondary);
            }
        }
    }
}
