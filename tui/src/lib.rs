//! The Switchyard console. For now it holds the wire model of the admin API that both the
//! daemon and the console speak.

pub mod wire;
