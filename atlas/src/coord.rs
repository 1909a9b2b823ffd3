//! The HTTP client side of a running coordinator (`nightshift serve`), used by the binary's
//! `apply` and by `record --coordinator`: base-URL handling, bearer auth, clear errors for an
//! unreachable coordinator and for non-2xx answers (the gateway's `{"error": {"message"}}` is
//! shown), the model id (`GET /v1/models`) and the live atlas (`GET /v1/atlas`, checked).
//! Blocking reqwest: the binary does one request at a time and needs no async runtime.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use nightshift_atlas::trace::Atlas;
use reqwest::blocking::{Client, RequestBuilder};

/// A coordinator at a base URL.
pub struct Coordinator {
    base: String,
    client: Client,
    api_key: Option<String>,
}

/// What came back: status and body text.
pub struct Answer {
    pub status: reqwest::StatusCode,
    pub body: String,
}

impl Answer {
    /// The body as JSON, when it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.body).ok()
    }

    /// The gateway's error message (`/error/message`), else the start of the body.
    pub fn error_message(&self) -> String {
        self.json()
            .as_ref()
            .and_then(|v| v.pointer("/error/message"))
            .and_then(|m| m.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| self.body.chars().take(500).collect())
    }
}

/// `http://` is assumed when `url` has no scheme; trailing slashes are dropped.
pub fn base_url(url: &str) -> String {
    let base = url.trim().trim_end_matches('/');
    if base.contains("://") {
        base.to_string()
    } else {
        format!("http://{base}")
    }
}

impl Coordinator {
    /// A client for `url` with `timeout` per request (connecting gives up after 10 s).
    pub fn new(url: &str, api_key: Option<&str>, timeout: Duration) -> Result<Coordinator> {
        let client = Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(timeout)
            .build()
            .context("building the HTTP client")?;
        Ok(Coordinator {
            base: base_url(url),
            client,
            api_key: api_key.filter(|k| !k.is_empty()).map(str::to_string),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn auth(&self, req: RequestBuilder) -> RequestBuilder {
        match &self.api_key {
            Some(k) => req.bearer_auth(k),
            None => req,
        }
    }

    fn send(&self, url: &str, req: RequestBuilder) -> Result<Answer> {
        let resp = self
            .auth(req)
            .send()
            .with_context(|| format!("cannot reach the coordinator at {url}"))?;
        let status = resp.status();
        let body = resp
            .text()
            .with_context(|| format!("reading the coordinator's answer from {url}"))?;
        Ok(Answer { status, body })
    }

    /// `GET path`, any status.
    pub fn get(&self, path: &str) -> Result<Answer> {
        let url = self.url(path);
        self.send(&url, self.client.get(&url))
    }

    /// `POST path` with a body of `content_type`, any status.
    pub fn post(&self, path: &str, content_type: &str, body: String) -> Result<Answer> {
        let url = self.url(path);
        let req = self
            .client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body);
        self.send(&url, req)
    }

    /// `POST path` with a JSON body; non-2xx is an error naming `what`.
    pub fn post_json_ok(
        &self,
        path: &str,
        body: &serde_json::Value,
        what: &str,
    ) -> Result<serde_json::Value> {
        let a = self.post(path, "application/json", body.to_string())?;
        if !a.status.is_success() {
            bail!(
                "{what}: the coordinator answered HTTP {} at {}: {}",
                a.status,
                self.url(path),
                a.error_message()
            );
        }
        a.json().ok_or_else(|| {
            anyhow!(
                "{what}: expected a JSON answer from {}, found {:?}",
                self.url(path),
                a.body.chars().take(200).collect::<String>()
            )
        })
    }

    /// `GET path`; non-2xx is an error naming `what`.
    fn get_ok(&self, path: &str, what: &str) -> Result<Answer> {
        let a = self.get(path)?;
        if !a.status.is_success() {
            bail!(
                "{what}: the coordinator answered HTTP {} at {}: {}",
                a.status,
                self.url(path),
                a.error_message()
            );
        }
        Ok(a)
    }

    /// The id of the served model (`GET /v1/models`, first entry).
    pub fn model_id(&self) -> Result<String> {
        let a = self.get_ok("/v1/models", "listing the served model")?;
        a.json()
            .as_ref()
            .and_then(|v| v.pointer("/data/0/id"))
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .ok_or_else(|| {
                anyhow!(
                    "listing the served model: expected {{\"data\": [{{\"id\": ...}}]}} from {}, found {:?}",
                    self.url("/v1/models"),
                    a.body.chars().take(200).collect::<String>()
                )
            })
    }

    /// The live atlas (`GET /v1/atlas`), parsed and checked like an atlas file.
    pub fn atlas(&self) -> Result<Atlas> {
        let a = self.get_ok("/v1/atlas", "fetching the atlas")?;
        parse_atlas(&a.body).with_context(|| {
            format!(
                "the coordinator's atlas at {} is malformed",
                self.url("/v1/atlas")
            )
        })
    }
}

/// Parses the JSON body of `GET /v1/atlas` and runs the atlas file's consistency checks.
pub fn parse_atlas(body: &str) -> Result<Atlas> {
    let atlas: Atlas = serde_json::from_str(body).map_err(|e| {
        anyhow!(
            "expected the atlas JSON object, found {:?}: {e}",
            body.chars().take(80).collect::<String>()
        )
    })?;
    atlas.check()?;
    Ok(atlas)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_atlas::placement::ModelShape;

    #[test]
    fn base_urls() {
        for (input, want) in [
            ("127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("http://h:1/", "http://h:1"),
            (" https://h ", "https://h"),
        ] {
            assert_eq!(base_url(input), want, "{input}");
        }
    }

    #[test]
    fn atlas_bodies() {
        let shape = ModelShape {
            moe_layers: vec![1, 2],
            n_experts: 4,
            expert_bytes: 10,
        };
        let good = Atlas::empty("m", shape, 2, 64);
        let text = serde_json::to_string(&good).expect("json");
        assert_eq!(parse_atlas(&text).expect("good atlas"), good);
        // Wrong dimensions: valid JSON, inconsistent atlas.
        let mut bad = good.clone();
        bad.all_time.activations.pop();
        let text = serde_json::to_string(&bad).expect("json");
        let e = format!("{:#}", parse_atlas(&text).expect_err("inconsistent"));
        assert!(e.contains("inconsistent atlas"), "{e}");
        for body in ["", "<html>", "{\"format_version\": 1}", "[1, 2]"] {
            let e = format!("{:#}", parse_atlas(body).expect_err("malformed"));
            assert!(e.contains("expected the atlas JSON object"), "{body}: {e}");
        }
    }
}
