//! What the backend says about models and limits: the `/models` catalog, the `wham/usage`
//! document and the `x-codex-*` rate-limit headers.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::state::Account;

struct ModelDef {
    slug: &'static str,
    display_name: &'static str,
    description: &'static str,
    context_window: u64,
    priority: u32,
    xhigh: bool,
}

const MODELS: &[ModelDef] = &[
    ModelDef {
        slug: "gpt-6.1-sol",
        display_name: "GPT-6.1-Sol",
        description: "Codex CLI's default model.",
        context_window: 272_000,
        priority: 0,
        xhigh: true,
    },
    ModelDef {
        slug: "gpt-5.5",
        display_name: "GPT-5.5",
        description: "Latest frontier agentic coding model.",
        context_window: 272_000,
        priority: 0,
        xhigh: true,
    },
    ModelDef {
        slug: "gpt-5.4",
        display_name: "GPT-5.4",
        description: "Strong general-purpose model for coding and reasoning.",
        context_window: 272_000,
        priority: 1,
        xhigh: true,
    },
    ModelDef {
        slug: "gpt-5.4-mini",
        display_name: "GPT-5.4-Mini",
        description: "Smaller, faster and cheaper, for quick tasks.",
        context_window: 272_000,
        priority: 2,
        xhigh: false,
    },
    ModelDef {
        slug: "gpt-5.3-codex",
        display_name: "GPT-5.3-Codex",
        description: "Codex-optimized agentic coding model.",
        context_window: 272_000,
        priority: 3,
        xhigh: true,
    },
];

/// Context window of `model`, in tokens.
pub(crate) fn context_window(model: &str) -> u64 {
    MODELS
        .iter()
        .find(|m| m.slug == model)
        .map_or(272_000, |m| m.context_window)
}

fn model_entry(slug: &str, fallback_priority: u32) -> Value {
    let def = MODELS.iter().find(|m| m.slug == slug);
    let mut levels = vec![
        json!({"effort": "low", "description": "Fast responses with lighter reasoning"}),
        json!({"effort": "medium", "description": "Balances speed and reasoning depth for everyday tasks"}),
        json!({"effort": "high", "description": "Greater reasoning depth for complex problems"}),
    ];
    if def.is_none_or(|d| d.xhigh) {
        levels.push(
            json!({"effort": "xhigh", "description": "Extra high reasoning depth for complex problems"}),
        );
    }
    json!({
        "slug": slug,
        "display_name": def.map_or(slug, |d| d.display_name),
        "description": def.map_or("Simulated model.", |d| d.description),
        "default_reasoning_level": "medium",
        "supported_reasoning_levels": levels,
        "shell_type": "shell_command",
        "visibility": "list",
        "minimal_client_version": "0.0.1",
        "supported_in_api": true,
        "upgrade": null,
        "priority": def.map_or(fallback_priority, |d| d.priority),
        "base_instructions": "You are Codex, a coding agent. (simulated)",
        "supports_reasoning_summaries": true,
        "reasoning_summary_format": "experimental",
        "support_verbosity": true,
        "default_verbosity": "low",
        "apply_patch_tool_type": "freeform",
        "input_modalities": ["text", "image"],
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "supports_parallel_tool_calls": true,
        "context_window": def.map_or(272_000, |d| d.context_window),
        "experimental_supported_tools": [],
    })
}

/// `GET /models`: the account's models, and their etag.
pub(crate) fn models(account: &Account) -> (Value, String) {
    let models: Vec<Value> = account
        .supported_models
        .iter()
        .enumerate()
        .map(|(i, slug)| model_entry(slug, 10 + u32::try_from(i).unwrap_or(0)))
        .collect();
    let mut h = Sha256::new();
    for slug in &account.supported_models {
        h.update(slug.as_bytes());
        h.update(b"\n");
    }
    let etag: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (json!({ "models": models }), format!("W/\"{etag}\""))
}

fn window_json(w: &super::state::Window, now: u64) -> Value {
    json!({
        "used_percent": w.used_percent,
        "limit_window_seconds": w.len_secs,
        "reset_after_seconds": w.reset_after(now),
        "reset_at": w.reset_at,
    })
}

/// `GET /wham/usage`.
pub(crate) fn usage(account: &Account, now: u64) -> Value {
    let limit_reached = account.primary.used_percent >= 100.0
        || (!account.single_window && account.secondary.used_percent >= 100.0);
    json!({
        "user_id": account.spec.chatgpt_user_id,
        "account_id": account.id(),
        "email": account.spec.email,
        "plan_type": account.spec.plan,
        "rate_limit": {
            "allowed": !limit_reached,
            "limit_reached": limit_reached,
            "primary_window": window_json(&account.primary, now),
            "secondary_window": if account.single_window {
                Value::Null
            } else {
                window_json(&account.secondary, now)
            },
        },
        "credits": {"has_credits": false, "unlimited": false, "balance": "0"},
        "rate_limit_reset_credits": {
            "available_count": super::credits::available_count(account, now),
        },
    })
}

/// The `x-codex-*` headers every backend answer for an authenticated account carries.
pub(crate) fn rate_limit_headers(account: &Account, now: u64) -> Vec<(&'static str, String)> {
    let p = &account.primary;
    let s = &account.secondary;
    vec![
        ("x-codex-primary-used-percent", p.used_percent.to_string()),
        (
            "x-codex-primary-window-minutes",
            (p.len_secs / 60).to_string(),
        ),
        ("x-codex-primary-reset-at", p.reset_at.to_string()),
        (
            "x-codex-primary-reset-after-seconds",
            p.reset_after(now).to_string(),
        ),
        ("x-codex-secondary-used-percent", s.used_percent.to_string()),
        (
            "x-codex-secondary-window-minutes",
            (s.len_secs / 60).to_string(),
        ),
        ("x-codex-secondary-reset-at", s.reset_at.to_string()),
        (
            "x-codex-secondary-reset-after-seconds",
            s.reset_after(now).to_string(),
        ),
        ("x-codex-plan-type", account.spec.plan.clone()),
        ("x-codex-credits-has-credits", "false".to_string()),
        ("x-codex-credits-unlimited", "false".to_string()),
        ("x-codex-credits-balance", "0".to_string()),
    ]
}

/// The `codex.rate_limits` frame a WebSocket turn starts with (protocol §E): the same numbers
/// as the rate-limit headers.
pub(crate) fn rate_limits_event(account: &Account) -> Value {
    let window = |w: &super::state::Window| {
        json!({
            "used_percent": w.used_percent,
            "window_minutes": w.len_secs / 60,
            "reset_at": w.reset_at,
        })
    };
    json!({
        "type": "codex.rate_limits",
        "plan_type": account.spec.plan,
        "rate_limits": {
            "primary": window(&account.primary),
            "secondary": window(&account.secondary),
        },
        "credits": {"has_credits": false, "unlimited": false, "balance": "0"},
    })
}
