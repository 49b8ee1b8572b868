//! The one error type of the HTTP surface: OpenAI-shaped JSON, `{"error": {...}}`, with the
//! status and code a client can act on, and no internals.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use switchyard_admin::wire::{ErrorBody, ErrorDetail};

use crate::fleet::FleetError;
use crate::keys::KeyError;
use crate::store::StoreError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub message: String,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some(code),
            message,
        )
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("not_found"),
            message,
        )
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            message,
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            Some("internal_error"),
            message,
        )
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind.to_string(),
                code: self.code.map(str::to_string),
                param: None,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "store error");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("store_unavailable"),
            e.to_string(),
        )
    }
}

impl From<FleetError> for ApiError {
    fn from(e: FleetError) -> Self {
        match e {
            FleetError::NotFound(_) => ApiError::not_found(e.to_string()),
            FleetError::Ambiguous { .. } => ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                Some("ambiguous"),
                e.to_string(),
            ),
            FleetError::AuthFile(_) => ApiError::bad_request("invalid_auth_file", e.to_string()),
            FleetError::Invalid(_) => ApiError::bad_request("invalid_value", e.to_string()),
            FleetError::Store(s) => s.into(),
            FleetError::Refresh(_) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_error",
                Some("refresh_failed"),
                e.to_string(),
            ),
            FleetError::AccessToken { refused: true, .. } => {
                ApiError::bad_request("invalid_access_token", e.to_string())
            }
            FleetError::AccessToken { refused: false, .. } => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_error",
                Some("whoami_failed"),
                e.to_string(),
            ),
        }
    }
}

impl From<KeyError> for ApiError {
    fn from(e: KeyError) -> Self {
        match e {
            KeyError::NotFound(_) => ApiError::not_found(e.to_string()),
            KeyError::Ambiguous { .. } => ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                Some("ambiguous_name"),
                e.to_string(),
            ),
            KeyError::BadName(_) => ApiError::bad_request("invalid_name", e.to_string()),
            KeyError::BadPolicy(_) => ApiError::bad_request("invalid_policy", e.to_string()),
            KeyError::Duplicate(_) => ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                Some("duplicate"),
                e.to_string(),
            ),
            KeyError::Random(_) => ApiError::internal(e.to_string()),
            KeyError::Store(s) => s.into(),
        }
    }
}
