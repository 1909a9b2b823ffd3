//! Speculative decoding over HTTP (mock model, n-gram drafts with every draft riding): OpenAI's
//! `prediction` feeds the drafter and its accepted and rejected tokens come back in
//! `usage.completion_tokens_details`, the answer never changes, `"speculative": false` opts
//! out, a malformed prediction is a 400 naming the field, and `/metrics` counts drafts per
//! drafter.

use super::*;

fn body(max: u32) -> Value {
    let mut b = chat_body("write the same thing again", max);
    b["ignore_eos"] = json!(true);
    b
}

fn details(v: &Value) -> (u64, u64) {
    let d = &v["usage"]["completion_tokens_details"];
    (
        d["accepted_prediction_tokens"].as_u64().expect("accepted"),
        d["rejected_prediction_tokens"].as_u64().expect("rejected"),
    )
}

#[tokio::test]
async fn a_prediction_is_drafted_and_reported_and_never_changes_the_answer() {
    let plain = start(Opts::default()).await;
    let (st, want) = post(&plain, "/v1/chat/completions", body(40)).await;
    assert_eq!(st, 200, "{want}");
    assert_eq!(details(&want), (0, 0));
    let answer = want["choices"][0]["message"]["content"].clone();
    let s = start(Opts {
        spec: true,
        ..Default::default()
    })
    .await;
    let mut b = body(40);
    b["prediction"] = json!({"type": "content", "content": answer});
    let (st, got) = post(&s, "/v1/chat/completions", b.clone()).await;
    assert_eq!(st, 200, "{got}");
    assert_eq!(got["choices"][0]["message"]["content"], answer);
    let (accepted, _) = details(&got);
    assert!(accepted >= 30, "the predicted tokens are accepted: {got}");
    // text parts work as well; a wrong prediction costs rejections, never the answer
    b["prediction"] =
        json!({"type": "content", "content": [{"type": "text", "text": "zzzz zzzz zzzz"}]});
    let (_, got) = post(&s, "/v1/chat/completions", b.clone()).await;
    assert_eq!(got["choices"][0]["message"]["content"], answer);
    // opting out: no drafts at all
    b["prediction"] = json!({"type": "content", "content": answer});
    b["speculative"] = json!(false);
    let (_, got) = post(&s, "/v1/chat/completions", b).await;
    assert_eq!(got["choices"][0]["message"]["content"], answer);
    assert_eq!(details(&got), (0, 0));
    let text = metrics_page(&s).await;
    for name in [
        "nightshift_spec_drafted_tokens_total{drafter=\"ngram\"}",
        "nightshift_spec_accepted_tokens_total{drafter=\"ngram\"}",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
}

#[tokio::test]
async fn a_malformed_prediction_is_refused() {
    let s = start(Opts {
        spec: true,
        ..Default::default()
    })
    .await;
    let mut b = body(4);
    b["prediction"] = json!({"type": "image", "content": "x"});
    let (st, v) = post(&s, "/v1/chat/completions", b.clone()).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "prediction.type", "{v}");
    b["prediction"] = json!({"type": "content", "content": [{"type": "image_url"}]});
    let (st, v) = post(&s, "/v1/chat/completions", b).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "prediction.content[0].type", "{v}");
}
