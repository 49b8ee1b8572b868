//! Operators' rules (`[[rules]]` in the config): matched in order against the facts of a
//! failed request — its answer over HTTP or a WebSocket; never a token refresh or a usage poll
//! — before the built-in classification. The first rule that matches decides: the class
//! (`class`), how long the account cools (`cooldown`, instead of the ladder), where the effect
//! lands (`scope`: the account, this key's session, or this account for this model), or that
//! the answer goes back to the client as it is (`pass_through`). A rule never turns a success
//! into anything else: only failures are matched.
//!
//! Rules are checked when the config is read (`config check` names the bad key and its line)
//! and take effect from the next start or reload.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::health::Class;
use crate::base::glob::glob_match;
use crate::base::names::named;
use crate::upstream::failure::{Endpoint, Facts};

named! {
    /// Where a rule's effect lands.
    pub enum Scope {
        /// The account (its health: cooling, a login needed…), as the class says.
        Account => "account",
        /// This client key's session avoids the account for a while; the account is untouched.
        Session => "session",
        /// The account is avoided for this model only (like a model it may not use).
        Model => "model",
    }
}

named! {
    /// The transport a rule is limited to.
    pub enum RuleTransport {
        Http => "http",
        WebSocket => "websocket",
    }
}

/// The longest cooldown a rule may set.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(7 * 24 * 3600);

/// One rule, checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RuleToml", into = "RuleToml")]
pub struct Rule {
    pub name: String,
    /// Status ranges, inclusive; empty: any.
    pub status: Vec<(u16, u16)>,
    /// Error codes or types (lower case); empty: any.
    pub code: Vec<String>,
    /// Any of these in the message (lower case); empty: any.
    pub message_contains: Vec<String>,
    /// Each of these headers must contain its substring (names and substrings lower case).
    pub header: Vec<(String, String)>,
    pub model: Option<String>,
    pub transport: Option<RuleTransport>,
    pub class: Option<Class>,
    pub cooldown: Option<Duration>,
    pub scope: Scope,
    pub pass_through: bool,
}

impl Rule {
    /// Whether the rule matches a failure of a request for `model`.
    pub fn matches(&self, f: &Facts, model: &str) -> bool {
        if !matches!(f.endpoint, Endpoint::Responses | Endpoint::WebSocket) {
            return false;
        }
        if !self.status.is_empty()
            && !f
                .status
                .is_some_and(|s| self.status.iter().any(|(a, b)| (*a..=*b).contains(&s)))
        {
            return false;
        }
        if !self.code.is_empty() {
            let has = |v: &Option<String>| {
                v.as_deref()
                    .is_some_and(|c| self.code.iter().any(|w| c.eq_ignore_ascii_case(w)))
            };
            if !has(&f.error_code) && !has(&f.error_type) {
                return false;
            }
        }
        if !self.message_contains.is_empty() {
            let text = [f.message.as_deref(), f.transport.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" ")
                .to_lowercase();
            if !self.message_contains.iter().any(|m| text.contains(m)) {
                return false;
            }
        }
        for (name, want) in &self.header {
            let found = f
                .headers
                .iter()
                .any(|(n, v)| n == name && v.to_lowercase().contains(want));
            if !found {
                return false;
            }
        }
        if let Some(glob) = &self.model
            && !glob_match(glob, model)
        {
            return false;
        }
        if let Some(t) = self.transport {
            let on_ws = f.endpoint == Endpoint::WebSocket;
            if on_ws != (t == RuleTransport::WebSocket) {
                return false;
            }
        }
        true
    }
}

/// The first of `rules` that matches.
pub fn first_match<'a>(rules: &'a [Rule], f: &Facts, model: &str) -> Option<&'a Rule> {
    rules.iter().find(|r| r.matches(f, model))
}

/// A status, or a range of them (`"500-599"`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum StatusItem {
    Code(u16),
    Range(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(v) => vec![v],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A rule as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleToml {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<OneOrMany<StatusItem>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<OneOrMany<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message_contains: Option<OneOrMany<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    header: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    transport: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cooldown: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pass_through: bool,
}

fn status_range(item: StatusItem) -> Result<(u16, u16), String> {
    let ok = |s: u16| (100..=599).contains(&s);
    let (a, b) = match item {
        StatusItem::Code(c) => (c, c),
        StatusItem::Range(r) => {
            let r = r.trim();
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            let num = |s: &str| {
                s.trim().parse::<u16>().map_err(|_| {
                    format!("status `{r}`: use a code like 429 or a range like \"500-599\"")
                })
            };
            (num(a)?, num(b)?)
        }
    };
    if !ok(a) || !ok(b) || a > b {
        return Err(format!(
            "status {a}-{b}: statuses are 100 to 599, the range low to high"
        ));
    }
    Ok((a, b))
}

/// Failure classes a rule may give.
fn rule_class(name: &str) -> Result<Class, String> {
    match Class::from_name(name) {
        Some(Class::Success) => Err("a rule never turns an answer into a success".into()),
        Some(Class::ClientCancelled | Class::ClientStalled | Class::Abandoned) | None => {
            Err(format!(
                "class `{name}`: use quota, rate_limited, auth_expired, auth_dead, edge_challenge, \
                 model_unsupported, policy, caller or transient"
            ))
        }
        Some(c) => Ok(c),
    }
}

impl TryFrom<RuleToml> for Rule {
    type Error = String;

    fn try_from(t: RuleToml) -> Result<Rule, String> {
        let name = t.name.trim().to_string();
        if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
            return Err("a rule's `name` is 1 to 64 printable characters".into());
        }
        let at = |m: String| format!("rule `{name}`: {m}");
        let lower = |v: Option<OneOrMany<String>>| -> Vec<String> {
            v.map(OneOrMany::into_vec)
                .unwrap_or_default()
                .into_iter()
                .map(|s| s.trim().to_lowercase())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let status = t
            .status
            .map(OneOrMany::into_vec)
            .unwrap_or_default()
            .into_iter()
            .map(status_range)
            .collect::<Result<Vec<_>, _>>()
            .map_err(at)?;
        let code = lower(t.code);
        let message_contains = lower(t.message_contains);
        let header: Vec<(String, String)> = t
            .header
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.trim().to_lowercase(), v.to_lowercase()))
            .collect();
        let model = t.model.map(|m| m.trim().to_string());
        if model.as_deref() == Some("") {
            return Err(at("`model` is a glob such as \"gpt-5*\"".into()));
        }
        let transport = t
            .transport
            .map(|v| {
                RuleTransport::from_name(v.trim())
                    .ok_or_else(|| at(format!("transport `{v}`: use http or websocket")))
            })
            .transpose()?;
        if status.is_empty()
            && code.is_empty()
            && message_contains.is_empty()
            && header.is_empty()
            && model.is_none()
            && transport.is_none()
        {
            return Err(at(
                "it matches nothing: give status, code, message_contains, header, model or transport"
                    .into(),
            ));
        }
        let class = t
            .class
            .map(|c| rule_class(c.trim()).map_err(at))
            .transpose()?;
        let cooldown = t
            .cooldown
            .map(|c| match humantime::parse_duration(c.trim()) {
                Ok(d) if !d.is_zero() && d <= MAX_COOLDOWN => Ok(d),
                _ => Err(at(format!(
                    "cooldown `{c}`: a duration from 1s to 7d, such as \"90s\" or \"10m\""
                ))),
            })
            .transpose()?;
        let scope = match &t.scope {
            None => Scope::Account,
            Some(s) => Scope::from_name(s.trim())
                .ok_or_else(|| at(format!("scope `{s}`: use account, session or model")))?,
        };
        if t.pass_through && (class.is_some() || cooldown.is_some() || t.scope.is_some()) {
            return Err(at(
                "pass_through answers the client as is: it takes no class, cooldown or scope"
                    .into(),
            ));
        }
        // A cooldown that cannot take effect is refused rather than silently ignored.
        // (With scope session it is how long the session avoids the account; with scope
        // model how long the model is marked unsupported there.)
        if cooldown.is_some()
            && let Some(c) = class.filter(|c| {
                scope == Scope::Account && (!c.cools_account() || *c == Class::AuthDead)
            })
        {
            return Err(at(format!(
                "cooldown takes no effect with class `{}` (it does not cool the account for a \
                 while): drop it, or use quota, rate_limited, edge_challenge or transient",
                c.as_str()
            )));
        }
        if !t.pass_through && class.is_none() && cooldown.is_none() && t.scope.is_none() {
            return Err(at(
                "it does nothing: give class, cooldown, scope or pass_through = true".into(),
            ));
        }
        Ok(Rule {
            name,
            status,
            code,
            message_contains,
            header,
            model,
            transport,
            class,
            cooldown,
            scope,
            pass_through: t.pass_through,
        })
    }
}

impl From<Rule> for RuleToml {
    fn from(r: Rule) -> RuleToml {
        let many = |v: Vec<String>| (!v.is_empty()).then_some(OneOrMany::Many(v));
        RuleToml {
            name: r.name,
            status: (!r.status.is_empty()).then(|| {
                OneOrMany::Many(
                    r.status
                        .into_iter()
                        .map(|(a, b)| {
                            if a == b {
                                StatusItem::Code(a)
                            } else {
                                StatusItem::Range(format!("{a}-{b}"))
                            }
                        })
                        .collect(),
                )
            }),
            code: many(r.code),
            message_contains: many(r.message_contains),
            header: (!r.header.is_empty()).then(|| r.header.into_iter().collect()),
            model: r.model,
            transport: r.transport.map(|t| t.as_str().to_string()),
            class: r.class.map(|c| c.as_str().to_string()),
            cooldown: r
                .cooldown
                .map(|d| humantime::format_duration(d).to_string()),
            scope: (r.scope != Scope::Account).then(|| r.scope.as_str().to_string()),
            pass_through: r.pass_through,
        }
    }
}

/// Checks that no two rules share a name (for `deserialize_with` on the config's list).
pub fn unique_names<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Rule>, D::Error> {
    let rules = Vec::<Rule>::deserialize(d)?;
    let mut seen = std::collections::HashSet::new();
    for r in &rules {
        if !seen.insert(r.name.as_str()) {
            return Err(serde::de::Error::custom(format!(
                "two rules are named `{}`: names identify rules in records",
                r.name
            )));
        }
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::failure::Phase;

    fn rule(toml: &str) -> Result<Rule, String> {
        #[derive(Deserialize)]
        struct One {
            rules: Vec<Rule>,
        }
        toml::from_str::<One>(toml)
            .map(|mut o| o.rules.remove(0))
            .map_err(|e| e.to_string())
    }

    fn answer(status: u16, code: &str, message: &str) -> Facts {
        Facts {
            phase: Some(Phase::PreCommit),
            status: Some(status),
            error_code: (!code.is_empty()).then(|| code.to_string()),
            message: Some(message.to_string()),
            ..Facts::default()
        }
    }

    #[test]
    fn every_field_matches_what_it_names() {
        let r = rule(
            r#"[[rules]]
name = "all"
status = [429, "500-504"]
code = "upstream_busy"
message_contains = ["Rate Limit", "concurrency limit"]
header = { "x-upstream" = "Edge" }
model = "gpt-5*"
transport = "http"
class = "rate_limited"
cooldown = "1m"
"#,
        )
        .unwrap();
        let mut f = answer(503, "UPSTREAM_BUSY", "Upstream rate limit exceeded");
        f.headers = vec![("x-upstream".into(), "edge-7".into())];
        assert!(r.matches(&f, "gpt-5.5"));
        assert!(!r.matches(&f, "o3"), "model");
        let ws = Facts {
            endpoint: Endpoint::WebSocket,
            ..f.clone()
        };
        assert!(!r.matches(&ws, "gpt-5.5"), "transport");
        let token = Facts {
            endpoint: Endpoint::Token,
            ..f.clone()
        };
        assert!(!r.matches(&token, "gpt-5.5"), "only requests' failures");
        for (status, code, msg, header) in [
            (505, "upstream_busy", "rate limit", "edge"),
            (503, "other", "rate limit", "edge"),
            (503, "upstream_busy", "all fine", "edge"),
            (503, "upstream_busy", "rate limit", "core"),
        ] {
            let mut g = answer(status, code, msg);
            g.headers = vec![("x-upstream".into(), header.into())];
            assert!(!r.matches(&g, "gpt-5.5"), "{status} {code} {msg} {header}");
        }
        assert_eq!(r.class, Some(Class::RateLimited));
        assert_eq!(r.cooldown, Some(Duration::from_secs(60)));
        assert_eq!(r.scope, Scope::Account);
    }

    #[test]
    fn the_first_matching_rule_wins() {
        let rules: Vec<Rule> = ["a", "b"]
            .iter()
            .map(|n| {
                rule(&format!(
                    "[[rules]]\nname = \"{n}\"\nstatus = 429\nclass = \"transient\"\n"
                ))
                .unwrap()
            })
            .collect();
        let f = answer(429, "", "");
        assert_eq!(first_match(&rules, &f, "m").unwrap().name, "a");
        assert!(first_match(&rules, &answer(500, "", ""), "m").is_none());
    }

    #[test]
    fn bad_rules_are_refused_with_the_reason() {
        for (toml, says) in [
            ("name = \"x\"\nclass = \"transient\"", "matches nothing"),
            ("name = \"x\"\nstatus = 429", "does nothing"),
            (
                "name = \"x\"\nstatus = 429\nclass = \"success\"",
                "never turns",
            ),
            (
                "name = \"x\"\nstatus = 429\nclass = \"bogus\"",
                "class `bogus`",
            ),
            (
                "name = \"x\"\nstatus = 700\nclass = \"caller\"",
                "statuses are 100 to 599",
            ),
            (
                "name = \"x\"\nstatus = \"5xx\"\nclass = \"caller\"",
                "status `5xx`",
            ),
            (
                "name = \"x\"\nstatus = 429\ncooldown = \"soon\"",
                "cooldown `soon`",
            ),
            (
                "name = \"x\"\nstatus = 429\nscope = \"pool\"",
                "scope `pool`",
            ),
            (
                "name = \"x\"\nstatus = 429\ntransport = \"smtp\"\nclass = \"caller\"",
                "transport `smtp`",
            ),
            (
                "name = \"x\"\nstatus = 429\npass_through = true\nclass = \"caller\"",
                "pass_through",
            ),
            (
                "name = \"x\"\nstatus = 429\nclas = \"caller\"",
                "unknown field",
            ),
            (
                "name = \"x\"\nstatus = 400\nclass = \"caller\"\ncooldown = \"5m\"",
                "cooldown takes no effect with class `caller`",
            ),
            (
                "name = \"x\"\nstatus = 401\nclass = \"auth_dead\"\ncooldown = \"5m\"",
                "cooldown takes no effect with class `auth_dead`",
            ),
        ] {
            let err = rule(&format!("[[rules]]\n{toml}\n")).unwrap_err();
            assert!(err.contains(says), "{toml}: {err}");
        }
    }

    #[test]
    fn a_rule_round_trips_through_its_written_form() {
        let r = rule(
            "[[rules]]\nname = \"x\"\nstatus = [429, \"500-599\"]\nmessage_contains = \"Busy\"\nscope = \"session\"\n",
        )
        .unwrap();
        let text = toml::to_string(&RuleToml::from(r.clone())).unwrap();
        let again: Rule = toml::from_str::<RuleToml>(&text)
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(again, r);
    }
}
