//! Every pane drawn from fixture state on ratatui's test backend, at 160×48 (all panes at once)
//! and at 80×24 (one pane per tab), and asserted on its text; and the key handling.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use switchyard_admin::wire::*;

use crate::app::{App, Command, Overlay, Pane};
use crate::state::Link;

/// 2026-11-30T12:00:00Z.
const NOW_MS: u64 = 1_795_003_200_000;

fn rfc(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

fn account(n: u32, state: &str) -> Account {
    Account {
        id: format!("id{n:06}"),
        label: format!("sim-acct-{n}"),
        email: Some(format!("acct{n}@example.com")),
        plan: Some("plus".into()),
        chatgpt_account_id: format!("chatgpt-{n}"),
        enabled: state != "disabled",
        state: state.into(),
        created_at: rfc(NOW_MS - 86_400_000),
        reason: None,
        detail: None,
        cooldown_until: None,
        cooldown_remaining_s: None,
        level: 0,
        last_error: None,
        in_flight: 0,
        limit: 4,
        limit_exact: 4.0,
        max_concurrency: None,
        priority: 0,
        waiting: 0,
        oldest_wait_ms: None,
        draining: false,
        unsupported_models: Vec::new(),
        quota: None,
        proxy: None,
        error_rates: Vec::new(),
        login: Default::default(),
        token_expires_at: None,
        origin: None,
        routing_error: None,
    }
}

fn attempt(account: &str, class: &str, status: u16) -> Attempt {
    Attempt {
        account: account.into(),
        class: class.into(),
        status: Some(status),
        phase: (class != "success").then_some(Phase::PreHeaders),
        ms: 40,
        error: (class != "success").then(|| format!("{class} from upstream")),
        rule: None,
    }
}

fn rates(client: [f64; 2], upstream: [f64; 2]) -> Vec<ErrorRates> {
    [20, 60]
        .into_iter()
        .zip(client.into_iter().zip(upstream))
        .map(|(m, (c, u))| ErrorRates {
            window_minutes: m,
            requests: 10,
            attempts: 12,
            client_error_rate: Some(c),
            upstream_error_rate: Some(u),
        })
        .collect()
}

fn record(n: u64, ago_ms: u64) -> RequestRecord {
    RequestRecord {
        id: format!("req_{n:04}"),
        started_at: rfc(NOW_MS - ago_ms - 900),
        key: "laptop".into(),
        model: "gpt-5.1-codex".into(),
        stream: true,
        outcome: "success".into(),
        status: 200,
        account: Some("chatgpt-2".into()),
        attempts: vec![attempt("chatgpt-2", "success", 200)],
        ttft_ms: Some(420),
        duration_ms: 900,
        usage: Some(Usage {
            input_tokens: 1000,
            cached_tokens: 800,
            output_tokens: 120,
            reasoning_tokens: 40,
        }),
        path: "/v1/responses".into(),
        session: Some(format!("s{n:03}")),
        candidate_pool: vec!["chatgpt-2".into(), "chatgpt-3".into()],
        skipped: vec![Skip {
            account: "chatgpt-1".into(),
            reason: "cooling".into(),
        }],
        affinity: "reused".into(),
        queue: None,
        cached_tokens: Some(800),
        transport: "http".into(),
        ws: false,
        ws_connect_ms: None,
        terminal_source: Some("upstream".into()),
        service_tier: None,
        served_tier: None,
        credit_spend: None,
    }
}

/// Three client keys: `laptop` with every limit (an exhausted 5-hour budget, a refusal 12 s
/// ago), `ci-runner` without any, and a disabled `old-bot`.
fn keys() -> Vec<KeyLive> {
    let budget = |window: &str, limit: u64, used: u64, resets_in_s: Option<u64>| Budget {
        window: window.into(),
        limit,
        used,
        resets_in_s,
    };
    vec![
        KeyLive {
            id: "key_laptop".into(),
            name: "laptop".into(),
            enabled: true,
            in_flight: 2,
            max_concurrency: Some(4),
            waiting: 1,
            rpm: 12,
            rpm_limit: Some(60),
            tokens_today: 1_234_567,
            budgets: vec![
                budget("5h", 100_000, 100_000, Some(72 * 60)),
                budget("day", 1_000_000, 610_000, None),
                budget("week", 5_000_000, 1_000_000, None),
            ],
            last_refusal: Some("key_budget_exhausted".into()),
            last_refusal_ms: Some(NOW_MS - 12_000),
        },
        KeyLive {
            id: "key_ci".into(),
            name: "ci-runner".into(),
            enabled: true,
            in_flight: 3,
            rpm: 7,
            tokens_today: 950,
            ..KeyLive::default()
        },
        KeyLive {
            id: "key_old".into(),
            name: "old-bot".into(),
            enabled: false,
            ..KeyLive::default()
        },
    ]
}

/// Five accounts in every state, three requests: a failover, a plain success, a dropped
/// stream; and the keys above.
fn fixture() -> App {
    let mut a1 = account(1, "cooling");
    a1.reason = Some("quota".into());
    a1.cooldown_remaining_s = Some(41 * 60 + 5);
    a1.last_error = Some("usage limit reached".into());
    a1.quota = Some(Quota {
        primary_used_percent: Some(100.0),
        primary_reset_at: Some(rfc(NOW_MS + 41 * 60_000)),
        secondary_used_percent: Some(62.0),
        secondary_reset_at: Some(rfc(NOW_MS + 3 * 86_400_000)),
        plan: Some("plus".into()),
        observed_at: Some(rfc(NOW_MS)),
        reset_credits: Some(2),
        reset_credit_expires_at: None,
    });
    let mut a2 = account(2, "ready");
    a2.in_flight = 2;
    a2.waiting = 1;
    a2.oldest_wait_ms = Some(1200);
    a2.error_rates = rates([0.1, 0.05], [0.25, 0.13]);
    let a3 = account(3, "half_open");
    let mut a4 = account(4, "needs_reauth");
    a4.last_error = Some("auth_dead: token refresh: 401 refresh_token_reused".into());
    a4.reason = Some("auth_dead".into());
    a4.detail = Some("this login's refresh token was used by another client".into());
    let mut a5 = account(5, "disabled");
    a5.draining = true;

    let mut failover = record(1, 1000);
    failover.attempts = vec![
        Attempt {
            rule: Some("quota text".into()),
            ..attempt("chatgpt-1", "quota", 429)
        },
        attempt("chatgpt-2", "success", 200),
    ];
    failover.transport = "ws_connected".into();
    failover.ws = true;
    failover.ws_connect_ms = Some(12);
    failover.service_tier = Some("priority".into());
    failover.served_tier = Some("default".into());
    failover.credit_spend = Some(switchyard_admin::wire::CreditSpend {
        account: "chatgpt-2".into(),
        redeem_id: "r-1".into(),
        outcome: "reset".into(),
        windows_reset: 2,
        error: None,
        need: None,
        at: None,
    });
    failover.affinity = "rebound(quota)".into();
    failover.queue = Some(QueueWait {
        queue: "pool".into(),
        outcome: "acquired".into(),
        wait_ms: 1200,
    });
    let plain = record(2, 2000);
    let mut dropped = record(3, 3000);
    dropped.outcome = "stream_error".into();
    dropped.account = Some("chatgpt-3".into());
    dropped.attempts = vec![attempt("chatgpt-3", "transient", 200)];
    dropped.affinity = "new_bind".into();
    dropped.terminal_source = Some("synthetic".into());

    let feed = Feed {
        status: Status {
            version: "0.1.0".into(),
            protocol: PROTOCOL_VERSION,
            pid: 42,
            uptime_s: 3725,
            listen: "127.0.0.1:8080".into(),
            accounts: 5,
            accounts_by_state: Default::default(),
            in_flight: 2,
            waiting: 2,
            strategy: "quota_aware".into(),
            error_rates: rates([0.012, 0.008], [0.03, 0.036]),
        },
        accounts: vec![a1, a2, a3, a4, a5],
        requests: vec![failover, plain, dropped],
        sessions: [("chatgpt-2".to_string(), 3), ("chatgpt-3".to_string(), 1)]
            .into_iter()
            .collect(),
        ws_pool_idle: 2,
        ws_pool: [("chatgpt-2".to_string(), 2)].into_iter().collect(),
        breaker: "closed".into(),
        dropped_subscribers: 0,
        pool_waiting: 1,
        pool_oldest_wait_ms: Some(2500),
        now_ms: NOW_MS,
        keys: keys(),
    };
    let mut app = App::new("/run/switchyard/admin.sock".into());
    app.state.apply(FeedMessage {
        protocol: PROTOCOL_VERSION,
        dropped: 0,
        seq: 0,
        body: FeedBody::Snapshot(feed),
    });
    app.state.link = Link::Connected;
    app
}

fn screen(app: &App, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| super::draw(f, app)).unwrap();
    let buf = t.backend().buffer();
    let mut out = String::new();
    for y in 0..h {
        for x in 0..w {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

fn has(screen: &str, text: &str) {
    assert!(screen.contains(text), "`{text}` not on screen:\n{screen}");
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn ch(c: char) -> KeyEvent {
    key(KeyCode::Char(c))
}

#[test]
fn header_shows_version_uptime_link_and_rates() {
    let mut app = fixture();
    for (w, h) in [(160, 48), (80, 24)] {
        let s = screen(&app, w, h);
        has(
            &s,
            "Switchyard 0.1.0 · up 1h02m · quota_aware · ● connected",
        );
        has(&s, "req/s ");
        has(&s, "in-flight 2 waiting 2 dropped 0");
    }
    // The pool's two windows, beside the live rates.
    has(
        &screen(&app, 160, 48),
        "20m 1%/3% · 60m 1%/4% client/upstream",
    );
    app.state.link = Link::Reconnecting {
        in_s: 3,
        reason: "connection refused".into(),
    };
    has(
        &screen(&app, 160, 48),
        "● reconnecting in 3s (connection refused)",
    );
}

#[test]
fn accounts_pane_shows_state_slots_quota_and_rates() {
    let app = fixture();
    let wide = screen(&app, 160, 48);
    for text in [
        "sim-acct-1 <acct1@example.com>",
        "cooling quota 41m",
        "half-open",
        "needs re-login",
        "disabled draining",
        "2/4",
        "100% 41m",
        "62% 3d00h",
        "usage limit reached",
    ] {
        has(&wide, text);
    }
    // chatgpt-2 served two requests with 420 ms TTFT, all attempts succeeded; its upstream
    // error rates over 20 and 60 minutes.
    has(&wide, "100% 420ms");
    has(&wide, "Up err 20/60m");
    has(&wide, "25%/13%");
    let narrow = screen(&app, 80, 24);
    has(&narrow, "1 Accounts");
    // In shorter words: the reason and the countdown of a cooling account.
    for text in ["quota 41m", "half-open", "re-login", "2/4", "sim-acct-5"] {
        has(&narrow, text);
    }
    has(
        &narrow,
        "sim-acct-1 acct1@example.com id id000001 · 2 reset credits · last error: usage",
    );
}

#[test]
fn a_selected_account_that_needs_a_login_says_why() {
    let mut app = fixture();
    for _ in 0..3 {
        app.on_key(key(KeyCode::Down));
    }
    assert_eq!(app.selected_account().unwrap().label, "sim-acct-4");
    has(
        &screen(&app, 160, 48),
        "sim-acct-4 acct4@example.com id id000004 · this login's refresh token was used by \
         another client",
    );
}

#[test]
fn affinity_pane_shows_sessions_cache_and_decisions() {
    let mut app = fixture();
    let check = |s: &str| {
        has(s, "sessions");
        has(s, "reused 1 · new 1 · rebound 1 · none 0");
        has(s, "rebound(quota)");
        // chatgpt-2 served two requests of 1000 input tokens, 800 cached each.
        has(s, "80%");
    };
    check(&screen(&app, 160, 48));
    app.focus = Pane::Affinity;
    let narrow = screen(&app, 80, 24);
    check(&narrow);
    has(&narrow, "sim-acct-2            3        80%");
}

#[test]
fn queues_pane_shows_waiting_now_and_outcomes() {
    let mut app = fixture();
    let check = |s: &str| {
        has(s, "pool                 1     2.5s");
        has(s, "sim-acct-2           1     1.2s");
        has(s, "acquired 1 · timeout 0");
        has(s, "wait p50 1.2s · p95 1.2s (n=1)");
    };
    check(&screen(&app, 160, 48));
    app.focus = Pane::Queues;
    check(&screen(&app, 80, 24));
}

#[test]
fn transport_pane_shows_decisions_pool_and_breaker() {
    let mut app = fixture();
    let check = |s: &str| {
        has(s, "ws_connected");
        has(s, "breaker closed · WS pool idle 2");
        has(s, "sim-acct-2 2");
    };
    let wide = screen(&app, 160, 48);
    check(&wide);
    app.focus = Pane::Transport;
    let narrow = screen(&app, 80, 24);
    check(&narrow);
    // One ws_connected and two http turns in the last minute.
    let line = narrow.lines().find(|l| l.contains("│http ")).unwrap();
    assert!(
        line.trim_end_matches('│').trim_end().ends_with('2'),
        "{line}"
    );
}

#[test]
fn requests_pane_shows_the_attempt_chain() {
    let mut app = fixture();
    let wide = screen(&app, 160, 48);
    has(&wide, "sim-acct-1 ✗ quota → sim-acct-2 ✓");
    has(&wide, "ws_connected");
    has(&wide, "laptop");
    has(&wide, "1000/120");
    has(&wide, "sim-acct-3 ✗ transient");
    app.focus = Pane::Requests;
    let narrow = screen(&app, 80, 24);
    has(&narrow, "5 Requests");
    has(&narrow, "sim-acct-1 ✗ quota → sim-acct-2 ✓");
    has(&narrow, "420ms");
}

#[test]
fn enter_opens_the_full_record() {
    let mut app = fixture();
    app.on_key(ch('5'));
    assert_eq!(app.on_key(key(KeyCode::Enter)), None);
    assert_eq!(app.overlay, Overlay::Detail("req_0001".into()));
    for (w, h) in [(160, 48), (80, 24)] {
        let s = screen(&app, w, h);
        has(&s, "Request req_0001");
        has(&s, "candidates  sim-acct-2, sim-acct-3");
        has(&s, "skipped     sim-acct-1 (cooling)");
        has(&s, "pool queue · acquired after 1.2s");
        has(&s, "rebound(quota)");
        has(&s, "1. sim-acct-1 quota · status 429 · pre_headers");
        has(&s, "rule quota text");
        has(&s, "terminal    upstream: the backend's own answer");
        has(&s, "priority asked · default claimed by the answer");
        has(&s, "reset credit on sim-acct-2: reset · 2 window(s) reset");
    }
    app.on_key(key(KeyCode::Esc));
    assert_eq!(app.overlay, Overlay::None);
    // Down then Enter opens the second newest.
    app.on_key(key(KeyCode::Down));
    app.on_key(key(KeyCode::Enter));
    assert_eq!(app.overlay, Overlay::Detail("req_0002".into()));
    // The oldest: a stream the gateway ended itself.
    app.on_key(key(KeyCode::Esc));
    app.on_key(key(KeyCode::Down));
    app.on_key(key(KeyCode::Enter));
    assert_eq!(app.overlay, Overlay::Detail("req_0003".into()));
    has(
        &screen(&app, 160, 48),
        "terminal    synthetic: made by the gateway",
    );
}

#[test]
fn help_lists_the_keys() {
    let mut app = fixture();
    app.on_key(ch('?'));
    assert_eq!(app.overlay, Overlay::Help);
    for (w, h) in [(160, 48), (80, 24)] {
        let s = screen(&app, w, h);
        has(&s, "drain the account (no new sessions)");
        has(
            &s,
            "1-6         accounts, affinity, queues, transport, requests, keys",
        );
        has(&s, "q  Ctrl-C");
    }
    app.on_key(key(KeyCode::Esc));
    assert_eq!(app.overlay, Overlay::None);
}

#[test]
fn actions_ask_first_and_name_the_account() {
    let mut app = fixture();
    // Select the second account, then disable it.
    app.on_key(key(KeyCode::Down));
    assert_eq!(app.on_key(ch('d')), None);
    let s = screen(&app, 80, 24);
    has(&s, "Disable sim-acct-2 (id000002)?");
    has(&s, "y confirm · n cancel");
    let Some(Command::Send(p)) = app.on_key(ch('y')) else {
        panic!("y sends the action");
    };
    assert_eq!(
        (p.action, p.account.as_str()),
        (AccountAction::Disable, "id000002")
    );
    assert_eq!(app.overlay, Overlay::None);

    // `n` cancels a confirmation; outside one it drains, or ends draining.
    app.on_key(ch('c'));
    assert_eq!(app.on_key(ch('n')), None);
    assert_eq!(app.overlay, Overlay::None);
    app.on_key(ch('n'));
    assert!(matches!(&app.overlay, Overlay::Confirm(p) if p.action == AccountAction::Drain));
    app.on_key(key(KeyCode::Esc));
    app.on_key(ch('G')); // the last account is draining
    app.on_key(ch('n'));
    assert!(
        matches!(&app.overlay, Overlay::Confirm(p) if p.action == AccountAction::Undrain && p.label == "sim-acct-5")
    );
    app.on_key(ch('N'));
    for (c, action) in [
        ('e', AccountAction::Enable),
        ('r', AccountAction::Refresh),
        ('p', AccountAction::Probe),
        ('c', AccountAction::ClearCooldown),
    ] {
        app.on_key(ch(c));
        let Some(Command::Send(p)) = app.on_key(ch('y')) else {
            panic!("{c}");
        };
        assert_eq!(p.action, action);
    }
}

#[test]
fn panes_cycle_and_quit_keys_quit() {
    let mut app = fixture();
    assert_eq!(app.focus, Pane::Accounts);
    for expected in [
        Pane::Affinity,
        Pane::Queues,
        Pane::Transport,
        Pane::Requests,
        Pane::Keys,
        Pane::Accounts,
    ] {
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.focus, expected);
    }
    app.on_key(key(KeyCode::BackTab));
    assert_eq!(app.focus, Pane::Keys);
    app.on_key(ch('5'));
    assert_eq!(app.focus, Pane::Requests);
    app.on_key(ch('6'));
    assert_eq!(app.focus, Pane::Keys);
    app.on_key(ch('3'));
    assert_eq!(app.focus, Pane::Queues);
    assert_eq!(app.on_key(ch('q')), Some(Command::Quit));
    assert_eq!(
        app.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
        Some(Command::Quit)
    );
    // Quit works from inside a confirmation too.
    app.on_key(ch('d'));
    assert_eq!(app.on_key(ch('q')), Some(Command::Quit));
}

#[test]
fn selection_stays_on_its_account_and_request_as_data_moves() {
    let mut app = fixture();
    app.on_key(key(KeyCode::Down));
    app.on_key(key(KeyCode::Down));
    assert_eq!(app.selected_account().unwrap().label, "sim-acct-3");
    app.on_key(ch('5'));
    app.on_key(key(KeyCode::Down));
    assert_eq!(app.selected_request_index(), 1);
    // A new request arrives: the selection stays on the same record.
    let mut feed = Feed {
        requests: vec![record(9, 0)],
        now_ms: NOW_MS + 100,
        ..feed_of(&app)
    };
    feed.accounts.reverse();
    app.state.apply(FeedMessage {
        protocol: PROTOCOL_VERSION,
        dropped: 0,
        seq: 1,
        body: FeedBody::Update(feed),
    });
    assert_eq!(app.state.requests.len(), 4);
    assert_eq!(
        app.state.requests[app.selected_request_index()].record.id,
        "req_0002"
    );
    assert_eq!(app.selected_account().unwrap().label, "sim-acct-3");
    let s = screen(&app, 160, 48);
    has(&s, "4 seen");
}

#[test]
fn a_snapshot_after_a_reconnection_replaces_the_requests() {
    let mut app = fixture();
    assert_eq!(app.state.snapshots, 1);
    let feed = Feed {
        requests: vec![record(7, 0)],
        ..feed_of(&app)
    };
    app.state.apply(FeedMessage {
        protocol: PROTOCOL_VERSION,
        dropped: 0,
        seq: 0,
        body: FeedBody::Snapshot(feed),
    });
    assert_eq!(app.state.snapshots, 2);
    assert_eq!(app.state.requests.len(), 1);
}

/// The screen line of the keys table's row for `name` (the pane's left border, then the name).
fn key_row<'a>(screen: &'a str, name: &str) -> &'a str {
    let start = format!("│{name} ");
    screen
        .lines()
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("no key row `{name}`:\n{screen}"))
}

#[test]
fn keys_pane_shows_limits_budgets_and_refusals() {
    let mut app = fixture();
    let wide = screen(&app, 160, 48);
    has(&wide, "Keys · 3 keys · tokens since 00:00 UTC");
    has(&wide, "Tokens today");
    has(&wide, "Last refusal");
    let laptop = key_row(&wide, "laptop");
    for text in [
        "2/4 +1",
        "12/60",
        "1.2M",
        "5h █████ 100% 1h12m",
        "day ███░░ 61%",
        "week █░░░░ 20%",
        "key_budget_exhausted 12s ago",
    ] {
        assert!(laptop.contains(text), "`{text}` not in `{laptop}`");
    }
    // Without limits: bare counts, no bars, no refusal.
    let ci = key_row(&wide, "ci-runner");
    assert_eq!(
        ci.split_whitespace().collect::<Vec<_>>(),
        ["│ci-runner", "3", "7", "950", "│"],
        "{ci}"
    );
    key_row(&wide, "old-bot");

    // The Keys tab of a small terminal: narrower bars, the refusal under the table.
    app.on_key(ch('6'));
    let narrow = screen(&app, 80, 24);
    has(&narrow, "6 Keys");
    let laptop = key_row(&narrow, "laptop");
    for text in [
        "2/4 +1",
        "12/60",
        "1.2M",
        "5h ███ 100% 1h12m",
        "day ██░ 61%",
        "week █░░ 20%",
    ] {
        assert!(laptop.contains(text), "`{text}` not in `{laptop}`");
    }
    let ci = key_row(&narrow, "ci-runner");
    assert_eq!(
        ci.split_whitespace().collect::<Vec<_>>(),
        ["│ci-runner", "3", "7", "950", "│"],
        "{ci}"
    );
    has(
        &narrow,
        "laptop id key_laptop · last refusal: key_budget_exhausted 12s ago",
    );
    // The selection moves to the next key, which has no refusal.
    app.on_key(key(KeyCode::Down));
    assert_eq!(app.selected_key_index(), 1);
    assert_eq!(app.selected_account_index(), 0);
    has(&screen(&app, 80, 24), "ci-runner id key_ci · no refusal");
}

#[test]
fn keys_pane_fits_under_the_others_at_the_smallest_wide_size() {
    let app = fixture();
    let s = screen(&app, 120, 36);
    // Every pane is there, Requests still with its records.
    for title in [
        "Accounts",
        "Affinity",
        "Queues",
        "Transport",
        "Requests",
        "Keys",
    ] {
        has(&s, &format!(" {title} "));
    }
    has(&s, "sim-acct-1 ✗ quota → sim-acct-");
    has(&s, "sim-acct-3 ✗ transient");
    has(&s, "wait p50 1.2s · p95 1.2s (n=1)");
    let laptop = key_row(&s, "laptop");
    for text in [
        "2/4 +1",
        "12/60",
        "1.2M",
        "5h ███ 100% 1h12m",
        "day ██░ 61%",
        "week █░░ 20%",
        "key_budget_exhausted 12s ago",
    ] {
        assert!(laptop.contains(text), "`{text}` not in `{laptop}`");
    }
    key_row(&s, "ci-runner");
}

#[test]
fn a_disabled_key_is_dimmed() {
    let app = fixture();
    let mut t = Terminal::new(TestBackend::new(160, 48)).unwrap();
    t.draw(|f| super::draw(f, &app)).unwrap();
    let buf = t.backend().buffer();
    let text = screen(&app, 160, 48);
    let style = |name: &str| {
        let y = text
            .lines()
            .position(|l| l.starts_with(&format!("│{name} ")))
            .unwrap() as u16;
        buf[(1, y)].style()
    };
    assert_eq!(style("old-bot").fg, Some(ratatui::style::Color::DarkGray));
    assert!(
        style("old-bot")
            .add_modifier
            .contains(ratatui::style::Modifier::DIM)
    );
    assert_ne!(style("ci-runner").fg, Some(ratatui::style::Color::DarkGray));
}

#[test]
fn no_keys_says_how_to_make_one() {
    let mut app = fixture();
    app.state.keys.clear();
    app.on_key(ch('6'));
    has(
        &screen(&app, 80, 24),
        "no client keys: create one with `switchyard key create NAME`",
    );
}

#[test]
fn each_message_replaces_the_keys() {
    let mut app = fixture();
    assert_eq!(app.state.keys, keys());
    let mut only = keys()[1].clone();
    only.in_flight = 0;
    only.last_refusal = Some("key_rate_limited".into());
    only.last_refusal_ms = Some(NOW_MS);
    let feed = Feed {
        keys: vec![only.clone()],
        now_ms: NOW_MS + 5_000,
        ..feed_of(&app)
    };
    app.state.apply(FeedMessage {
        protocol: PROTOCOL_VERSION,
        dropped: 0,
        seq: 1,
        body: FeedBody::Update(feed),
    });
    assert_eq!(app.state.keys, vec![only]);
    app.on_key(ch('6'));
    let s = screen(&app, 160, 48);
    has(&s, "Keys · 1 keys");
    assert!(key_row(&s, "ci-runner").contains("key_rate_limited 5s ago"));
    assert!(!s.contains("│laptop "), "{s}");
    // A message without keys (every key revoked) empties the list.
    let feed = Feed {
        keys: Vec::new(),
        ..feed_of(&app)
    };
    app.state.apply(FeedMessage {
        protocol: PROTOCOL_VERSION,
        dropped: 0,
        seq: 2,
        body: FeedBody::Update(feed),
    });
    assert!(app.state.keys.is_empty());
}

#[test]
fn token_counts_read_short() {
    use super::keys::human_count;
    for (n, text) in [
        (0, "0"),
        (950, "950"),
        (1_234, "1.2k"),
        (34_000, "34k"),
        (999_999, "1.0M"),
        (3_400_000, "3.4M"),
        (12_000_000_000, "12G"),
    ] {
        assert_eq!(human_count(n), text, "{n}");
    }
}

fn feed_of(app: &App) -> Feed {
    let s = &app.state;
    Feed {
        status: s.status.clone().unwrap(),
        accounts: s.accounts.clone(),
        requests: Vec::new(),
        sessions: s.sessions.clone(),
        ws_pool_idle: s.ws_pool_idle,
        ws_pool: s.ws_pool.clone(),
        breaker: s.breaker.clone(),
        dropped_subscribers: s.dropped_subscribers,
        pool_waiting: s.pool_waiting,
        pool_oldest_wait_ms: s.pool_oldest_wait_ms,
        now_ms: s.now_ms,
        keys: s.keys.clone(),
    }
}

#[test]
fn r_opens_the_error_report_which_scrolls_and_closes() {
    let mut app = fixture();
    assert_eq!(app.on_key(ch('R')), Some(Command::Report));
    assert_eq!(
        app.overlay,
        Overlay::Report(crate::app::ReportView::Loading)
    );
    has(&screen(&app, 160, 48), "fetching the report…");
    let report = switchyard_admin::report::Report {
        generated_at: "2026-11-30T12:00:00Z".into(),
        slow_ms: 30_000,
        windows: vec![switchyard_admin::report::WindowReport {
            minutes: 20,
            requests: 12,
            ..Default::default()
        }],
        suggestions: Vec::new(),
    };
    app.on_report(Ok(report));
    for (w, h) in [(160, 48), (80, 24)] {
        let s = screen(&app, w, h);
        has(&s, "Error report");
        has(&s, "== last 20 minutes ==");
        has(&s, "requests 12");
    }
    // Down scrolls the first line away.
    app.on_key(key(KeyCode::Down));
    app.on_key(key(KeyCode::Down));
    assert!(!screen(&app, 160, 48).contains("Switchyard error report ·"));
    app.on_key(key(KeyCode::Esc));
    assert_eq!(app.overlay, Overlay::None);
    // A report that could not be had says why.
    app.on_key(ch('R'));
    app.on_report(Err("daemon gone".into()));
    has(&screen(&app, 80, 24), "no report: daemon gone");
    // A late answer after the overlay closed changes nothing.
    app.on_key(key(KeyCode::Esc));
    app.on_report(Err("late".into()));
    assert_eq!(app.overlay, Overlay::None);
}

/// At 120×40 (a common terminal, above the tabs' threshold) the State column keeps the reason
/// and the countdown of every cooling account, in shorter words rather than cut.
#[test]
fn at_120x40_the_state_column_keeps_reason_and_countdown() {
    let mut app = fixture();
    let mut rate = account(6, "cooling");
    rate.reason = Some("rate_limited".into());
    rate.cooldown_remaining_s = Some(4 * 60 + 59);
    let mut edge = account(7, "cooling");
    edge.reason = Some("edge_challenge".into());
    edge.cooldown_remaining_s = Some(3 * 3600 + 7 * 60);
    edge.draining = true;
    let mut transient = account(8, "cooling");
    transient.reason = Some("transient".into());
    transient.cooldown_remaining_s = Some(20);
    app.state.accounts.extend([rate, edge, transient]);
    let s = screen(&app, 120, 40);
    for text in [
        "quota 41m",
        "rate 4m",
        "edge 3h07m drain",
        "transient 20s",
        "half-open",
        "re-login",
    ] {
        has(&s, text);
    }
    // At 160 columns every column has its full width, with the long words.
    let s = screen(&app, 160, 48);
    has(&s, "cooling rate_limited 4m");
    has(&s, "cooling transient 20s");
    // Longer than the column even there: the short words.
    has(&s, "edge 3h07m drain");
}
