//! One simulated turn: what the model "does" with a request, as the event sequence of
//! protocol §D, played as SSE, as WebSocket text frames, or as the final JSON response object.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use super::faults::{Cut, StreamShape};
use super::server::Step;

/// What the model answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    Message(String),
    /// A message about the output of the tool call that ends the input.
    Report(String),
    /// An `exec_command` call with this command line.
    ExecCommand(String),
    /// The input ended with `compaction_trigger`: one `compaction` item.
    Compaction,
    /// The request offers the `image_generation` tool: one image of this prompt.
    Image(String),
}

/// Decides the answer from the request body (deterministic).
pub(crate) fn plan(request: &Value, account_id: &str) -> Plan {
    let input = request["input"].as_array();
    let last = input.and_then(|i| i.last()).unwrap_or(&Value::Null);
    match last["type"].as_str() {
        Some("compaction_trigger") => return Plan::Compaction,
        Some("function_call_output") | Some("custom_tool_call_output") => {
            let out: String = text_of(&last["output"]).chars().take(200).collect();
            return Plan::Report(format!("The command printed: {out}"));
        }
        _ => {}
    }
    let is_user_message = matches!(last["type"].as_str(), Some("message") | None)
        && last["role"].as_str() == Some("user");
    if is_user_message
        && request["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["type"] == "image_generation"))
    {
        return Plan::Image(text_of(&last["content"]));
    }
    if is_user_message && shell_tool(request).is_some() {
        let text = text_of(&last["content"]);
        if let Some(cmd) = run_command(&text) {
            return Plan::ExecCommand(cmd);
        }
    }
    Plan::Message(format!(
        "Hello from {account_id}. This is a simulated Codex reply."
    ))
}

/// The text of a string, or of an array of content parts (`input_text`, `output_text`, …).
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str().or_else(|| p.as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The shell tool the request offers, and the name of its command argument: Codex's
/// `exec_command` (`cmd`), or a `Bash` tool as Claude Code's (`command`).
fn shell_tool(request: &Value) -> Option<(&'static str, &'static str)> {
    let tools = request["tools"].as_array()?;
    let named = |n: &str| {
        tools
            .iter()
            .any(|t| t["name"].as_str() == Some(n) || t["function"]["name"].as_str() == Some(n))
    };
    if named("exec_command") {
        Some(("exec_command", "cmd"))
    } else if named("Bash") {
        Some(("Bash", "command"))
    } else {
        None
    }
}

/// `run: <command>` anywhere in the text: the rest of that line, trimmed.
fn run_command(text: &str) -> Option<String> {
    let at = text.find("run:")?;
    let rest = &text[at + "run:".len()..];
    let cmd = rest.lines().next().unwrap_or("").trim();
    (!cmd.is_empty()).then(|| cmd.to_string())
}

/// Everything a turn needs to know about its request.
pub(crate) struct TurnSpec<'a> {
    pub id_suffix: String,
    pub account_id: &'a str,
    pub request: &'a Value,
    pub model: &'a str,
    pub created_at: u64,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    /// `response.failed` with this code after `response.in_progress`...
    pub fail_code: Option<String>,
    /// ...or after this many deltas of a normal answer.
    pub fail_after: Option<u32>,
    /// False for a WebSocket warm-up (`generate:false`): created, then completed, no output.
    pub generate: bool,
    /// Echoed in the response object (WebSocket continuations).
    pub previous_response_id: Option<String>,
    /// The message is this many bytes of text instead of the greeting (a compaction: its
    /// encrypted content).
    pub answer_bytes: Option<usize>,
    /// The answer ends with `response.incomplete` for this reason.
    pub incomplete: Option<String>,
    /// The tier the answer says it ran on.
    pub service_tier: String,
}

/// A generated event: its `type` and full JSON (with `sequence_number`).
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub kind: &'static str,
    pub data: Value,
}

impl Event {
    fn is_delta(&self) -> bool {
        self.kind.ends_with(".delta")
    }

    /// `event: <type>\ndata: <json>\n\n`
    pub fn sse(&self) -> Bytes {
        Bytes::from(format!("event: {}\ndata: {}\n\n", self.kind, self.data))
    }
}

pub(crate) struct Turn {
    pub events: Vec<Event>,
    /// The final response object (`status` completed or failed).
    pub response: Value,
}

struct Builder {
    events: Vec<Event>,
}

impl Builder {
    /// Appends an event: `type` first (as the backend writes it), then `data`'s fields, then
    /// `sequence_number`.
    fn push(&mut self, kind: &'static str, data: Value) {
        let mut ordered = serde_json::Map::new();
        ordered.insert("type".into(), json!(kind));
        if let Value::Object(m) = data {
            ordered.extend(m);
        }
        ordered.insert("sequence_number".into(), json!(self.events.len()));
        self.events.push(Event {
            kind,
            data: Value::Object(ordered),
        });
    }
}

/// Splits text into word-sized deltas (each keeps its trailing whitespace).
fn chunks(text: &str, max_chars: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for ch in text.chars() {
        cur.push(ch);
        if (ch == ' ' || ch == '\n' || cur.chars().count() >= max_chars) && !cur.trim().is_empty() {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn response_object(spec: &TurnSpec<'_>, status: &str) -> Value {
    let r = spec.request;
    json!({
        "id": format!("resp_{}", spec.id_suffix),
        "object": "response",
        "created_at": spec.created_at,
        "status": status,
        "background": false,
        "error": null,
        "incomplete_details": null,
        "model": spec.model,
        "output": [],
        "parallel_tool_calls": r["parallel_tool_calls"].as_bool().unwrap_or(true),
        "previous_response_id": spec.previous_response_id,
        "prompt_cache_key": r["prompt_cache_key"],
        "reasoning": {
            "effort": r["reasoning"]["effort"].as_str().unwrap_or("medium"),
            "summary": r["reasoning"]["summary"].as_str().unwrap_or("auto"),
        },
        "service_tier": spec.service_tier,
        "store": false,
        "text": {"format": {"type": "text"}, "verbosity": r["text"]["verbosity"].as_str().unwrap_or("medium")},
        "tool_choice": r["tool_choice"].as_str().unwrap_or("auto"),
        "usage": null,
    })
}

fn encrypted(kind: &str, spec: &TurnSpec<'_>) -> String {
    use base64::Engine;
    let raw = format!("{kind}:{}:{}", spec.account_id, spec.id_suffix);
    format!(
        "gAAAAAB{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
    )
}

/// `base` with `extra`'s fields added.
fn merged(base: &Value, extra: Value) -> Value {
    let mut v = base.clone();
    if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
        m.extend(e);
    }
    v
}

/// Builds the whole event sequence of a turn.
pub(crate) fn build(spec: &TurnSpec<'_>, plan: &Plan) -> Turn {
    let mut b = Builder { events: Vec::new() };
    let mut response = response_object(spec, "in_progress");
    b.push("response.created", json!({"response": response}));
    if !spec.generate && spec.fail_code.is_none() {
        // A warm-up generates nothing and bills nothing; it still primes the prompt cache.
        response["status"] = json!("completed");
        response["usage"] = json!({
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        });
        b.push("response.completed", json!({"response": response}));
        return Turn {
            events: b.events,
            response,
        };
    }
    b.push("response.in_progress", json!({"response": response}));
    if let Some(code) = spec
        .fail_code
        .as_ref()
        .filter(|_| spec.fail_after.is_none())
    {
        response["status"] = json!("failed");
        response["error"] = json!({"code": code, "message": super::faults::failed_message(code)});
        b.push("response.failed", json!({"response": response}));
        return Turn {
            events: b.events,
            response,
        };
    }
    let mut output = Vec::new();
    let (visible_chars, reasoning_chars) = match plan {
        Plan::Compaction => {
            output.push(compaction(&mut b, spec));
            (200, 0)
        }
        Plan::Image(prompt) => {
            output.push(image_call(&mut b, spec, prompt));
            (prompt.len(), 0)
        }
        Plan::ExecCommand(cmd) => {
            let thought = format!("The user asked me to run `{cmd}`, so I will call exec_command.");
            let (item, chars) = reasoning(&mut b, spec, "Running a command", &thought);
            output.push(item);
            output.push(exec_call(&mut b, spec, cmd));
            (cmd.len() + 12, chars)
        }
        Plan::Report(text) | Plan::Message(text) => {
            let (title, thought) = if matches!(plan, Plan::Report(_)) {
                (
                    "Reading the output",
                    "The command finished; I will summarise what it printed.",
                )
            } else {
                (
                    "Answering",
                    "A short greeting is all this needs; I will reply briefly.",
                )
            };
            let (item, chars) = reasoning(&mut b, spec, title, thought);
            output.push(item);
            let long = spec.answer_bytes.map(|n| {
                "All work and no play makes a long answer. "
                    .chars()
                    .cycle()
                    .take(n)
                    .collect::<String>()
            });
            let text = long.as_deref().unwrap_or(text);
            output.push(message(&mut b, spec, text));
            (text.len(), chars)
        }
    };
    let visible_tokens = u64::try_from(visible_chars / 4).unwrap_or(0).max(1);
    let reasoning_tokens = (u64::try_from(reasoning_chars).unwrap_or(0) / 4 * 3).max(1);
    let output_tokens = visible_tokens + reasoning_tokens;
    response["status"] = json!("completed");
    response["output"] = Value::Array(output);
    response["usage"] = json!({
        "input_tokens": spec.input_tokens,
        "input_tokens_details": {"cached_tokens": spec.cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": spec.input_tokens + output_tokens,
    });
    if let (Some(code), Some(after)) = (&spec.fail_code, spec.fail_after) {
        // The answer breaks off after `after` deltas with a failure.
        let mut deltas = 0;
        let cut = b.events.iter().position(|ev| {
            deltas += u32::from(ev.is_delta());
            ev.is_delta() && deltas > after
        });
        if let Some(at) = cut {
            b.events.truncate(at);
        }
        let mut failed = response_object(spec, "failed");
        failed["error"] = json!({"code": code, "message": super::faults::failed_message(code)});
        b.push("response.failed", json!({"response": failed}));
        return Turn {
            events: b.events,
            response: failed,
        };
    }
    if let Some(reason) = &spec.incomplete {
        response["status"] = json!("incomplete");
        response["incomplete_details"] = json!({"reason": reason});
        b.push("response.incomplete", json!({"response": response}));
        return Turn {
            events: b.events,
            response,
        };
    }
    b.push("response.completed", json!({"response": response}));
    Turn {
        events: b.events,
        response,
    }
}

/// The one `compaction` item of a compaction turn.
fn compaction(b: &mut Builder, spec: &TurnSpec<'_>) -> Value {
    let id = format!("cmp_{}", spec.id_suffix);
    b.push(
        "response.output_item.added",
        json!({"output_index": 0, "item": {"id": id, "type": "compaction"}}),
    );
    let mut content = encrypted("compaction", spec);
    if let Some(n) = spec.answer_bytes {
        // A long answer: the compacted history is padded to `n` bytes.
        let pad = n.saturating_sub(content.len());
        content.extend(std::iter::repeat_n('A', pad));
    }
    let item = json!({"id": id, "type": "compaction", "encrypted_content": content});
    b.push(
        "response.output_item.done",
        json!({"output_index": 0, "item": item}),
    );
    item
}

/// The reasoning item (output 0) with a streamed summary; returns it and the summary length.
fn reasoning(b: &mut Builder, spec: &TurnSpec<'_>, title: &str, thought: &str) -> (Value, usize) {
    let summary = format!("**{title}**\n\n{thought}");
    let rs = format!("rs_{}", spec.id_suffix);
    b.push(
        "response.output_item.added",
        json!({"output_index": 0, "item": {"id": rs, "type": "reasoning", "summary": []}}),
    );
    let part = |text: &str| json!({"type": "summary_text", "text": text});
    let at = json!({"item_id": rs, "output_index": 0, "summary_index": 0});
    b.push(
        "response.reasoning_summary_part.added",
        merged(&at, json!({"part": part("")})),
    );
    for d in chunks(&summary, 12) {
        b.push(
            "response.reasoning_summary_text.delta",
            merged(&at, json!({"delta": d})),
        );
    }
    b.push(
        "response.reasoning_summary_text.done",
        merged(&at, json!({"text": summary})),
    );
    b.push(
        "response.reasoning_summary_part.done",
        merged(&at, json!({"part": part(&summary)})),
    );
    let item = json!({"id": rs, "type": "reasoning", "summary": [part(&summary)],
        "encrypted_content": encrypted("reasoning", spec)});
    b.push(
        "response.output_item.done",
        json!({"output_index": 0, "item": item}),
    );
    (item, summary.len())
}

/// A 1×1 PNG, base64: what every simulated image is.
pub(crate) const IMAGE_PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

fn image_call(b: &mut Builder, spec: &TurnSpec<'_>, prompt: &str) -> Value {
    let ig = format!("ig_{}", spec.id_suffix);
    let tool = spec.request["tools"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["type"] == "image_generation"))
        .cloned()
        .unwrap_or(Value::Null);
    b.push(
        "response.output_item.added",
        json!({"output_index": 0, "item": {"id": ig, "type": "image_generation_call", "status": "in_progress"}}),
    );
    b.push(
        "response.image_generation_call.in_progress",
        json!({"output_index": 0, "item_id": ig}),
    );
    b.push(
        "response.image_generation_call.generating",
        json!({"output_index": 0, "item_id": ig}),
    );
    b.push(
        "response.image_generation_call.completed",
        json!({"output_index": 0, "item_id": ig}),
    );
    let item = json!({"id": ig, "type": "image_generation_call", "status": "completed",
        "result": IMAGE_PNG_B64, "revised_prompt": format!("A picture of: {prompt}"),
        "size": tool["size"].as_str().unwrap_or("1024x1024"),
        "quality": tool["quality"].as_str().unwrap_or("auto"),
        "output_format": tool["output_format"].as_str().unwrap_or("png"),
        "background": tool["background"].as_str().unwrap_or("opaque")});
    b.push(
        "response.output_item.done",
        json!({"output_index": 0, "item": item}),
    );
    item
}

fn exec_call(b: &mut Builder, spec: &TurnSpec<'_>, cmd: &str) -> Value {
    let fc = format!("fc_{}", spec.id_suffix);
    let call = format!("call_{}", spec.id_suffix);
    let (name, arg) = shell_tool(spec.request).unwrap_or(("exec_command", "cmd"));
    let mut args = serde_json::Map::new();
    args.insert(arg.into(), json!(cmd));
    let arguments = Value::Object(args).to_string();
    b.push(
        "response.output_item.added",
        json!({"output_index": 1, "item": {"id": fc, "type": "function_call", "status": "in_progress",
            "arguments": "", "call_id": call, "name": name}}),
    );
    for d in chunks(&arguments, 8) {
        b.push(
            "response.function_call_arguments.delta",
            json!({"item_id": fc, "call_id": call, "output_index": 1, "delta": d}),
        );
    }
    b.push(
        "response.function_call_arguments.done",
        json!({"item_id": fc, "call_id": call, "output_index": 1, "arguments": arguments}),
    );
    let item = json!({"id": fc, "type": "function_call", "status": "completed",
        "arguments": arguments, "call_id": call, "name": name});
    b.push(
        "response.output_item.done",
        json!({"output_index": 1, "item": item}),
    );
    item
}

fn message(b: &mut Builder, spec: &TurnSpec<'_>, text: &str) -> Value {
    let msg = format!("msg_{}", spec.id_suffix);
    let part =
        |t: &str| json!({"type": "output_text", "annotations": [], "logprobs": [], "text": t});
    b.push(
        "response.output_item.added",
        json!({"output_index": 1, "item": {"id": msg, "type": "message", "status": "in_progress",
            "content": [], "role": "assistant"}}),
    );
    let base = json!({"item_id": msg, "output_index": 1, "content_index": 0});
    let at = |extra: Value| merged(&base, extra);
    b.push("response.content_part.added", at(json!({"part": part("")})));
    // A long answer goes in 4 KiB deltas; a short one word by word.
    let deltas = if spec.answer_bytes.is_some() {
        text.as_bytes()
            .chunks(4096)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect()
    } else {
        chunks(text, 16)
    };
    for d in deltas {
        b.push(
            "response.output_text.delta",
            at(json!({"delta": d, "logprobs": []})),
        );
    }
    b.push(
        "response.output_text.done",
        at(json!({"text": text, "logprobs": []})),
    );
    b.push(
        "response.content_part.done",
        at(json!({"part": part(text)})),
    );
    let item = json!({"id": msg, "type": "message", "status": "completed",
        "content": [part(text)], "role": "assistant"});
    b.push(
        "response.output_item.done",
        json!({"output_index": 1, "item": item}),
    );
    item
}

/// One step of playing a turn, whatever carries it.
#[derive(Debug)]
pub(crate) enum Beat<'a> {
    Event(&'a Event),
    Pause(Duration),
    /// The turn ends here, without its terminal event.
    Cut(Cut),
}

/// How a turn plays, shaped by a fault (pauses, a cut) and the profile's pacing. A cut comes
/// after `after_deltas` deltas, and at the latest instead of the terminal event.
pub(crate) fn beats<'a>(
    turn: &'a Turn,
    shape: &StreamShape,
    delta_pause: Option<Duration>,
) -> Vec<Beat<'a>> {
    let mut beats = Vec::with_capacity(turn.events.len() + 2);
    let mut deltas = 0u32;
    let last = turn.events.len().saturating_sub(1);
    for (i, ev) in turn.events.iter().enumerate() {
        let terminal = i == last && i > 0;
        if let Some(cut) = shape.cut
            && ((ev.is_delta() && deltas >= cut.after_deltas()) || terminal)
        {
            beats.push(Beat::Cut(cut));
            return beats;
        }
        if ev.is_delta() {
            if deltas == 0 {
                if let Some(d) = shape.first_delta_delay {
                    beats.push(Beat::Pause(d));
                }
            } else if let Some(d) = delta_pause {
                beats.push(Beat::Pause(d));
            }
            deltas += 1;
        }
        beats.push(Beat::Event(ev));
    }
    beats
}

/// The SSE body of a turn.
pub(crate) fn sse_steps(
    turn: &Turn,
    shape: &StreamShape,
    delta_pause: Option<Duration>,
) -> Vec<Step> {
    beats(turn, shape, delta_pause)
        .into_iter()
        .map(|beat| match beat {
            Beat::Event(ev) => Step::Data(ev.sse()),
            Beat::Pause(d) => Step::Pause(d),
            // `Close` is WebSocket-only; over HTTP the nearest thing is a reset.
            Beat::Cut(Cut::Reset { .. } | Cut::Close { .. }) => Step::Reset,
            Beat::Cut(Cut::Hang { .. }) => Step::Hang,
        })
        .collect()
}

/// A unary JSON body, shaped by a fault: a pause before it, or cut/hang half-way.
pub(crate) fn json_steps(body: &Value, shape: &StreamShape) -> Vec<Step> {
    let bytes = Bytes::from(body.to_string());
    let mut steps = Vec::new();
    if let Some(d) = shape.first_delta_delay {
        steps.push(Step::Pause(d));
    }
    match shape.cut {
        None => steps.push(Step::Data(bytes)),
        Some(Cut::Reset { .. } | Cut::Close { .. }) => {
            steps.push(Step::Data(bytes.slice(..bytes.len() / 2)));
            steps.push(Step::Reset);
        }
        Some(Cut::Hang { .. }) => steps.push(Step::Hang),
    }
    steps
}
