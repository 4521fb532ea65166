//! The live meter (stub).
