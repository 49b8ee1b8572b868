//! What every layer uses and that knows nothing of the rest of the crate: the clock, the
//! serving threads and their coarse timeouts, the stable names of enums, URL encoding, globs,
//! durations for people, periodic jobs, JSON objects read as raw members, and one-shot signals.

pub mod clock;
pub mod cores;
pub mod deadline;
pub mod duration;
pub mod glob;
pub mod job;
pub mod json_scan;
pub(crate) mod names;
pub mod raw_json;
pub mod signal;
pub(crate) mod urlcode;
