//! `ApiError`: every failure the gateway reports, as OpenAI's error JSON
//! (`{"error": {"message", "type", "param", "code"}}`) with a matching HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `not_found_error`, `server_error`, ...).
    pub kind: &'static str,
    /// The request parameter at fault.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is invalid (`param` names the field).
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// 404: the model is not served here.
    pub fn model_not_found(model: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 503: no worker can take the request.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "service_unavailable_error",
            param: None,
            code: None,
        }
    }

    /// 502: a worker failed while serving the request.
    pub fn upstream(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_GATEWAY,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The error object (the value of the `error` key).
    pub fn body(&self) -> serde_json::Value {
        json!({ "message": self.message, "type": self.kind, "param": self.param, "code": self.code })
    }

    /// Maps a worker's gRPC status: its validation errors are the client's fault (400).
    pub fn from_status(s: &tonic::Status) -> ApiError {
        match s.code() {
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange => {
                ApiError::invalid(None, s.message())
            }
            tonic::Code::Unavailable => {
                ApiError::unavailable(format!("worker unavailable: {}", s.message()))
            }
            _ => ApiError::upstream(format!("worker failed: {}", s.message())),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(json!({ "error": self.body() }))).into_response()
    }
}
