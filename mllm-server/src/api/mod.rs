//! The OpenAI-compatible JSON: request parsing and validation, response
//! bodies and stream chunks, and errors.

pub mod error;
pub mod request;
pub mod response;
pub mod validate;

pub use error::ApiError;
