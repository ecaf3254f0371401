//! The SQL seam (filled in by issue 4).
