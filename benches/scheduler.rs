//! Scheduler pick among 10, 100 and 1,000 accounts (DESIGN §11 budget: < 20 µs at 1,000), and
//! the wake-up latency of a queued request when a slot is released.
//!
//! `cargo bench --bench scheduler`
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use switchyard::base::clock;
use switchyard::fleet::Fleet;
use switchyard::fleet::settings::Settings;
use switchyard::sim::auth::{AuthSpec, auth_json};
use switchyard::store::Store;

fn fleet(rt: &tokio::runtime::Runtime, n: u32, max_concurrency: u32) -> Fleet {
    rt.block_on(async {
        let settings = Settings {
            max_concurrency,
            ..Settings::default()
        };
        let f =
            Fleet::load_with(Store::open_in_memory().unwrap(), clock::system(), settings).unwrap();
        for i in 0..n {
            let spec = AuthSpec {
                email: format!("u{i}@example.com"),
                chatgpt_account_id: format!("acct-{i}"),
                chatgpt_user_id: format!("user-{i}"),
                plan: "plus".into(),
                access_exp: 4_000_000_000,
                token_tag: "t".into(),
            };
            let parsed = f
                .parse_auth(auth_json(&spec).to_string().as_bytes())
                .unwrap();
            // Vouched for: measured as the accounts of a pool that has proved them.
            let id = f.import(parsed).await.unwrap().account.id;
            f.proven(&id);
        }
        f
    })
}

fn pick(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("pick");
    for n in [10u32, 100, 1000] {
        let f = fleet(&rt, n, 3);
        group.bench_with_input(BenchmarkId::from_parameter(n), &f, |b, f| {
            b.iter(|| {
                // Freeze the candidates, take a slot on the first, give it back.
                let plan = f.plan(black_box("gpt-5.5"), Some("session-1"));
                let lease = f.try_lease(&plan.order[0], "gpt-5.5").unwrap();
                black_box(&lease);
            });
        });
    }
    group.finish();
}

fn wakeup(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let f = Arc::new(fleet(&rt, 1, 1));
    let id = f.plan("gpt-5.5", None).order[0].clone();
    c.bench_function("queue_wakeup", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let held = f.try_lease(&id, "gpt-5.5").unwrap();
                    let (f2, id2) = (Arc::clone(&f), id.clone());
                    let waiter = tokio::spawn(async move {
                        let (lease, _) = f2
                            .wait_for_pool(
                                &[id2],
                                "gpt-5.5",
                                Duration::from_secs(5),
                                10,
                                std::future::pending(),
                            )
                            .await;
                        (Instant::now(), lease.is_some())
                    });
                    // Release once the waiter is queued.
                    while f.waiting().0 == 0 {
                        tokio::task::yield_now().await;
                    }
                    let released = Instant::now();
                    drop(held);
                    let (woke, got) = waiter.await.unwrap();
                    assert!(got);
                    total += woke - released;
                }
                total
            })
        });
    });
}

criterion_group!(benches, pick, wakeup);
criterion_main!(benches);
