//! What the notifier learns by looking at the pool: accounts whose login died, that were
//! deactivated or came back, the pool's headroom, and a dry pool that serves again without a
//! request having told it so.

use std::collections::HashMap;

use super::{Event, EventKind, Notifier};
use crate::fleet::health::{AccountState, Reauth};
use crate::fleet::{AccountView, Fleet};

/// An account's login, as last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Login {
    Alive,
    Dead,
    Deactivated,
}

fn login_of(a: &AccountView) -> Login {
    match (a.state, a.reauth) {
        (AccountState::NeedsReauth, Some(Reauth::AccountDeactivated)) => Login::Deactivated,
        (AccountState::NeedsReauth, _) => Login::Dead,
        _ => Login::Alive,
    }
}

fn name_of(a: &AccountView) -> String {
    a.email.clone().unwrap_or_else(|| a.id.clone())
}

/// The watcher's memory between two looks.
#[derive(Default)]
pub struct Watch {
    logins: HashMap<String, Login>,
    headroom: Option<i64>,
}

/// The pool's remaining quota in percent: the mean, over enabled accounts with a live login
/// whose usage is known, of what is left of their fuller window. `None` when none is known.
pub fn headroom(accounts: &[AccountView]) -> Option<f64> {
    let left: Vec<f64> = accounts
        .iter()
        .filter(|a| a.enabled && login_of(a) == Login::Alive)
        .filter_map(|a| {
            let q = a.quota.as_ref()?;
            let used = match (q.primary_used_percent, q.secondary_used_percent) {
                (None, None) => return None,
                (p, s) => p.unwrap_or(0.0).max(s.unwrap_or(0.0)),
            };
            Some((100.0 - used).clamp(0.0, 100.0))
        })
        .collect();
    (!left.is_empty()).then(|| left.iter().sum::<f64>() / left.len() as f64)
}

impl Watch {
    /// One look: the events since the last.
    pub fn look(&mut self, fleet: &Fleet, notifier: &Notifier) {
        let accounts = fleet.list();
        let now = fleet.clock().now_ms();
        for a in &accounts {
            if !a.enabled {
                continue;
            }
            let login = login_of(a);
            let before = self.logins.insert(a.id.clone(), login);
            if before == Some(login) {
                continue;
            }
            let who = name_of(a);
            let event = match login {
                Login::Dead => Event::new(
                    EventKind::AccountNeedsLogin,
                    now,
                    format!(
                        "Account {who} needs a new login: {}.",
                        a.reauth.map_or("its login was refused", Reauth::describe)
                    ),
                ),
                Login::Deactivated => Event::new(
                    EventKind::AccountDeactivated,
                    now,
                    format!("Account {who} was deactivated by ChatGPT."),
                ),
                // Only a login that was dead comes back (a first look at a live one says
                // nothing).
                Login::Alive if before.is_some() => Event::new(
                    EventKind::AccountRecovered,
                    now,
                    format!("Account {who} serves again."),
                ),
                Login::Alive => continue,
            };
            notifier.emit(event.account(who).detail("account_id", a.id.clone()));
        }
        if let Some(h) = headroom(&accounts) {
            let rounded = h.round() as i64;
            if self.headroom != Some(rounded) {
                self.headroom = Some(rounded);
                notifier.emit(
                    Event::new(
                        EventKind::PoolHeadroomLow,
                        now,
                        format!("The pool has {rounded}% of its quota left."),
                    )
                    .detail("headroom_percent", h),
                );
            }
        }
        // A dry pool whose accounts are back serves again even if no request says so.
        if accounts
            .iter()
            .any(|a| a.enabled && a.state == AccountState::Ready)
        {
            for model in notifier.dry_models() {
                notifier.served(&model, now);
            }
        }
    }
}
