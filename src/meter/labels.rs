//! The names the meter files requests under, shared by its tables and its Prometheus labels (a
//! leaf, so both read one definition).

/// Name of the scope that collects users beyond the cap and models beyond [`MAX_TRACKED_MODELS`].
pub const OTHER: &str = "other";
/// Model scope of requests that named no model.
pub const UNKNOWN_MODEL: &str = "unknown";
/// Models tracked individually (live view and metric labels); further ones fold into `"other"`.
pub const MAX_TRACKED_MODELS: usize = 100;
