//! What runs in the pages' Web Workers: the engine the playground talks
//! to when no server does ([`engine`]), the engine the cell's Python asks
//! ([`python`]), and the reader of a snapshot file ([`snapshot_reader`]).
//! `main` mounts nothing where there is no window.

pub mod engine;
pub mod python;
pub mod snapshot_reader;
