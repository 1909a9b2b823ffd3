//! Optional shared-token authentication between coordinator and nodes: a tonic interceptor that
//! requires `authorization: Bearer <token>` and compares it in constant time.

use subtle::ConstantTimeEq;
use tonic::{Request, Status};

/// Accepts every request when built without a token.
#[derive(Clone)]
pub struct Interceptor {
    token: Option<Vec<u8>>,
}

impl Interceptor {
    /// `None` disables authentication.
    pub fn new(token: Option<String>) -> Interceptor {
        Interceptor {
            token: token.map(|t| format!("Bearer {t}").into_bytes()),
        }
    }
}

impl tonic::service::Interceptor for Interceptor {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(want) = &self.token else {
            return Ok(req);
        };
        let got = req
            .metadata()
            .get(nightshift_proto::AUTH_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or(b"");
        if got.len() == want.len() && bool::from(got.ct_eq(want)) {
            Ok(req)
        } else {
            Err(Status::unauthenticated("missing or wrong node auth token"))
        }
    }
}
