//! The HTTP API as an OpenAPI 3.1 document, served at `GET /openapi.json`: derived (utoipa)
//! from the request and response types in `types.rs` and the `#[utoipa::path]` of each
//! handler, so it cannot drift from what the server parses and writes; where a handler reads a
//! field loosely (tools, content blocks), a shape type beside the request says what it takes,
//! and the limits the edge checks are the schema's bounds (`tests/openapi_bounds.rs` pins them).
//! The test command fuzzes the live server from it with schemathesis (no 5xx, every answer in
//! its documented shape, and generated valid bodies served).

use super::error::Body;
use super::{anthropic, atlas, handlers, responses, AppState};
use axum::extract::State;
use axum::Json;
use std::sync::Arc;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "NightShift",
        description = "OpenAI-compatible chat and completions for mixture-of-experts models \
                       served from CPUs, with NightShift's extensions and operations endpoints."
    ),
    paths(
        handlers::chat,
        handlers::completions,
        responses::create,
        responses::get,
        responses::delete,
        responses::input_items,
        anthropic::messages,
        anthropic::count_tokens,
        handlers::apply_template,
        handlers::models,
        handlers::admin_kv,
        handlers::health,
        handlers::ready,
        handlers::metrics,
        atlas::get_atlas,
        atlas::get_placement,
        atlas::post_placement,
    ),
    components(schemas(
        crate::gateway::types::ChatChunk,
        anthropic::types::ErrorOut,
        anthropic::types::ErrorDetailOut,
    )),
    modifiers(&ApiKey)
)]
pub struct ApiDoc;

/// The errors of every endpoint that reads a request body (the document's one list of them;
/// `ApiError` builds the bodies, so the variants are never constructed).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum BodyErrors<'a> {
    /// A request field is missing, malformed or out of range (`param` names it)
    #[response(status = 400)]
    Invalid(Body<'a>),
    /// Missing or wrong API key
    #[response(status = 401)]
    Unauthorized(Body<'a>),
    /// The body did not arrive within --body-timeout
    #[response(status = 408)]
    SlowBody(Body<'a>),
    /// The body is larger than the server takes
    #[response(status = 413)]
    TooLarge(Body<'a>),
}

/// The further errors of the generating endpoints.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum GenerationErrors<'a> {
    /// The `model` named is not the one served
    #[response(status = 404)]
    UnknownModel(Body<'a>),
    /// Too many requests waiting
    #[response(status = 429)]
    Busy(Body<'a>),
    /// Shutting down, or expert nodes unreachable
    #[response(status = 503)]
    Unavailable(Body<'a>),
    /// The request took longer than --request-timeout
    #[response(status = 504)]
    Timeout(Body<'a>),
}

/// The bearer API key (`--api-key`); every path that takes it also works without one when
/// the server has none.
struct ApiKey;

impl Modify for ApiKey {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "api_key",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The document (built once).
pub fn document() -> &'static serde_json::Value {
    static DOC: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = ApiDoc::openapi();
        doc.info.version = env!("CARGO_PKG_VERSION").to_string();
        serde_json::to_value(doc).unwrap_or_default()
    })
}

/// What a server's document states about the model it serves: the limits the request types
/// cannot know, checked against this model at the edge (`convert`).
pub struct Served<'a> {
    pub model_id: &'a str,
    pub aliases: &'a [String],
    /// The context size: a prompt and its completion budget fit in it.
    pub n_ctx: usize,
    /// The vocabulary's size: token ids are below it.
    pub vocab: usize,
    /// An empty text prompt has tokens: the model adds a BOS token to a text prompt.
    pub empty_text_has_tokens: bool,
}

/// The document of a server: `model` takes exactly the served model's id or an alias, a token
/// id is below the vocabulary's size, chat's and completions' token budgets leave at least
/// one prompt token in the context, and a completion prompt's text may be empty when the
/// model adds a BOS token (it is then that token alone).
pub fn served_document(s: &Served) -> serde_json::Value {
    let mut doc = document().clone();
    let names: Vec<&str> = std::iter::once(s.model_id)
        .chain(s.aliases.iter().map(String::as_str))
        .collect();
    for req in [
        "ChatRequest",
        "CompletionRequest",
        "ResponsesRequest",
        "MessagesRequest",
        "CountTokensRequest",
    ] {
        let at = format!("/components/schemas/{req}/properties/model");
        if let Some(m) = doc.pointer_mut(&at) {
            *m = serde_json::json!({
                "type": "string",
                "enum": names,
                "description": "The served model's id (`GET /v1/models`)."
            });
        }
    }
    let mut set_max = |at: &str, max: usize| {
        if let Some(serde_json::Value::Object(m)) = doc.pointer_mut(at) {
            m.insert("maximum".into(), max.into());
        }
    };
    set_max("/components/schemas/TokenId", s.vocab.saturating_sub(1));
    for at in [
        "ChatRequest/properties/max_tokens",
        "ChatRequest/properties/max_completion_tokens",
        "CompletionRequest/properties/max_tokens",
    ] {
        set_max(
            &format!("/components/schemas/{at}"),
            s.n_ctx.saturating_sub(1).max(1),
        );
    }
    if s.empty_text_has_tokens {
        // `PromptField`'s text and list of one text
        for at in ["oneOf/0", "oneOf/1/items"] {
            let at = format!("/components/schemas/PromptField/{at}");
            if let Some(serde_json::Value::Object(m)) = doc.pointer_mut(&at) {
                m.remove("minLength");
            }
        }
    }
    doc
}

/// `GET /openapi.json`.
pub async fn openapi_json(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(served_document(&Served {
        model_id: &st.model_id,
        aliases: &st.model_aliases,
        n_ctx: st.scheduler.options().n_ctx,
        vocab: st.text.vocab_size(),
        empty_text_has_tokens: !st.text.encode("", false).is_empty(),
    }))
}
