//! Workspace routing: an account of a data-residency workspace is served by its own backend
//! origin. Codex asks `GET {chatgpt}/wham/accounts/check` before a turn; an account whose
//! `account_routing_override` constrains it (`us`, `us_cr`) is sent to its
//! `workspace_backend_origin` instead of the configured origin, with the override in the
//! `x-openai-account-routing-override` header. `NO_CONSTRAINT` (or no override) keeps the
//! configured origin.

use serde_json::Value;

/// The header that carries an account's routing override.
pub const OVERRIDE_HEADER: &str = "x-openai-account-routing-override";

/// Where one account's requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// `https://host[:port]`.
    pub origin: String,
    /// What the header says (`us`, `us_cr`, …).
    pub override_value: String,
    /// `{base}` with the origin replaced: `/responses`, `/models` … hang off it.
    pub base_url: String,
    /// The same for `wham/usage`.
    pub usage_url: String,
}

/// What discovery found for an account: no constraint (the configured origin), or a route.
pub type Discovery = Option<Route>;

/// Reads a `wham/accounts/check` answer for `account` (its `chatgpt_account_id`): the
/// accounts as a list of objects with `id`, or as a map keyed by id. `base_url` and
/// `usage_url` are the configured ones, whose origin a route replaces; an origin must be
/// `https` unless the configured one is plain `http` (a local backend).
pub fn discovery(
    answer: &Value,
    account: &str,
    base_url: &str,
    usage_url: &str,
) -> Result<Discovery, String> {
    let entry = match &answer["accounts"] {
        Value::Array(list) => list.iter().find(|a| a["id"] == account),
        Value::Object(map) => map.get(account),
        _ => None,
    }
    .ok_or_else(|| format!("the answer does not list the account {account}"))?;
    let constraint = entry["account_routing_override"]
        .as_str()
        .filter(|o| !o.is_empty() && !o.eq_ignore_ascii_case("NO_CONSTRAINT"));
    let Some(constraint) = constraint else {
        return Ok(None);
    };
    let origin = entry["workspace_backend_origin"]
        .as_str()
        .filter(|o| !o.is_empty())
        .ok_or_else(|| format!("routing `{constraint}` names no workspace_backend_origin"))?;
    let origin = origin_of(origin, base_url.starts_with("http://"))?;
    Ok(Some(Route {
        base_url: with_origin(base_url, &origin)?,
        usage_url: with_origin(usage_url, &origin)?,
        origin,
        override_value: constraint.to_string(),
    }))
}

/// `scheme://authority` of an origin, checked.
fn origin_of(origin: &str, allow_http: bool) -> Result<String, String> {
    let uri: axum::http::Uri = origin
        .parse()
        .map_err(|e| format!("workspace_backend_origin `{origin}` is not a URL: {e}"))?;
    let scheme = uri.scheme_str().unwrap_or("");
    let ok = scheme == "https" || (allow_http && scheme == "http");
    let authority = uri
        .authority()
        .filter(|_| ok)
        .ok_or_else(|| format!("workspace_backend_origin `{origin}` is not an https origin"))?;
    Ok(format!("{scheme}://{authority}"))
}

/// `url` with its `scheme://authority` replaced by `origin`.
fn with_origin(url: &str, origin: &str) -> Result<String, String> {
    let rest = url
        .split_once("://")
        .map(|(_, r)| r)
        .ok_or_else(|| format!("`{url}` has no scheme"))?;
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    Ok(format!("{origin}{path}"))
}

/// The `wham/accounts/check` URL next to a `wham/usage` one.
pub fn check_url(usage_url: &str) -> String {
    match usage_url.strip_suffix("/usage") {
        Some(wham) => format!("{wham}/accounts/check"),
        None => format!("{usage_url}/accounts/check"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BASE: &str = "https://chatgpt.com/backend-api/codex";
    const USAGE: &str = "https://chatgpt.com/backend-api/wham/usage";

    #[test]
    fn an_unconstrained_account_keeps_the_configured_origin() {
        for entry in [
            json!({"id": "a", "account_routing_override": "NO_CONSTRAINT"}),
            json!({"id": "a"}),
            json!({"id": "a", "account_routing_override": null, "workspace_backend_origin": "https://x"}),
        ] {
            let answer = json!({"accounts": [entry], "default_account_id": "a"});
            assert_eq!(discovery(&answer, "a", BASE, USAGE), Ok(None));
        }
    }

    #[test]
    fn a_residency_account_goes_to_its_origin_with_its_override() {
        let list = json!({"accounts": [{"id": "b"}, {"id": "a", "plan_type": "enterprise",
            "workspace_backend_origin": "https://us.chatgpt.example", "account_routing_override": "us"}]});
        let map = json!({"accounts": {"a": {"workspace_backend_origin": "https://us.chatgpt.example/",
            "account_routing_override": "us"}}});
        for answer in [list, map] {
            let r = discovery(&answer, "a", BASE, USAGE).unwrap().unwrap();
            assert_eq!(r.origin, "https://us.chatgpt.example");
            assert_eq!(r.override_value, "us");
            assert_eq!(r.base_url, "https://us.chatgpt.example/backend-api/codex");
            assert_eq!(
                r.usage_url,
                "https://us.chatgpt.example/backend-api/wham/usage"
            );
        }
    }

    #[test]
    fn what_cannot_be_followed_is_an_error_not_a_silent_default() {
        let answer = |entry: Value| json!({"accounts": [entry]});
        for (a, why) in [
            (json!({}), "does not list"),
            (answer(json!({"id": "other"})), "does not list"),
            (
                answer(json!({"id": "a", "account_routing_override": "us_cr"})),
                "names no",
            ),
            (
                answer(json!({"id": "a", "account_routing_override": "us",
                    "workspace_backend_origin": "http://plain.example"})),
                "not an https origin",
            ),
        ] {
            let err = discovery(&a, "a", BASE, USAGE).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        // A local backend (plain http configured) may route to a plain http origin.
        let local = answer(json!({"id": "a", "account_routing_override": "us",
            "workspace_backend_origin": "http://localhost:9"}));
        let r = discovery(
            &local,
            "a",
            "http://127.0.0.1:9/backend-api/codex",
            "http://127.0.0.1:9/backend-api/wham/usage",
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.base_url, "http://localhost:9/backend-api/codex");
    }

    #[test]
    fn the_check_url_sits_next_to_usage() {
        assert_eq!(
            check_url(USAGE),
            "https://chatgpt.com/backend-api/wham/accounts/check"
        );
    }
}
