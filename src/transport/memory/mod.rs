//! The in-process broker behind `memory://name` (feature `memory`).
