//! A notification sink for tests: whatever is posted under `/sink/` is kept (path, headers,
//! body) and answered 200, or 503 while failures are queued (a receiver that is down). A
//! webhook's URL, an ntfy topic URL and a Telegram API base can all point here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Sim;
use super::server::{Outcome, SimRequest, json};

/// One delivery the sink received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SinkDelivery {
    pub path: String,
    /// Lower-case names.
    pub headers: BTreeMap<String, String>,
    pub body: String,
    /// 200, or 503 when it was refused.
    pub status: u16,
}

/// The sink's state.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    pub received: Vec<SinkDelivery>,
    /// Deliveries still to refuse.
    pub failures: u32,
}

pub(crate) fn handle(sim: &Sim, req: &SimRequest) -> Outcome {
    let mut st = sim.lock();
    let status = if st.sink.failures > 0 {
        st.sink.failures -= 1;
        503
    } else {
        200
    };
    st.sink.received.push(SinkDelivery {
        path: req.path.clone(),
        headers: super::server::recorded_headers(&req.headers),
        body: String::from_utf8_lossy(&req.body).into_owned(),
        status,
    });
    json(status, &json!({"ok": status == 200})).into()
}
