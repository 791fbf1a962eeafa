//! Your snapshot's components: the page ([`page`]), its timelines
//! ([`chart`]), the segments and events at an event ([`trace`]), the active
//! memory timeline ([`active`]) and the comparison and fix panels
//! ([`compare`]).

pub mod active;
pub mod chart;
pub mod compare;
pub mod page;
pub mod trace;
