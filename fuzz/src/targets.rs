//! The fuzz targets: each takes arbitrary bytes, feeds them to one parser or edge that reads
//! untrusted data, and checks what must hold whatever the input (no panic; on success, the
//! invariants the rest of the system relies on). Fixtures come from `model/tests/data` and
//! `fuzz/data` (two published chat templates), loaded once.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use nightshift_atlas::placement::{ModelShape, Placement};
use nightshift_atlas::trace::Atlas;
use nightshift_expert_node::service::NodeService;
use nightshift_expert_node::store::ExpertStore;
use nightshift_model::chat::{ChatMessage, ChatTemplate};
use nightshift_model::gguf::{check_image, Gguf};
use nightshift_model::tokenizer::{Protect, StreamDecoder, Tokenizer};
use prost::Message;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/data")
        .join(name)
}

/// The fixture models whose tokenizers and templates the text targets use.
pub const MODELS: [&str; 2] = ["tiny-qwen3moe-Q2_K.gguf", "tiny-deepseek2-Q2_K.gguf"];

struct Fixture {
    gguf: Arc<Gguf>,
    tok: Tokenizer,
    template: ChatTemplate,
}

fn fixtures() -> &'static [Fixture] {
    static F: OnceLock<Vec<Fixture>> = OnceLock::new();
    F.get_or_init(|| {
        MODELS
            .iter()
            .map(|m| {
                let gguf = Arc::new(Gguf::open(&data(m)).expect("fixture model"));
                let tok = Tokenizer::from_gguf(&gguf).expect("fixture tokenizer");
                let template = ChatTemplate::from_gguf(&gguf)
                    .expect("fixture template")
                    .expect("has a template");
                Fixture {
                    gguf,
                    tok,
                    template,
                }
            })
            .collect()
    })
}

/// The published templates (Qwen3-30B-A3B, Kimi K2) in `fuzz/data`.
fn published() -> &'static [ChatTemplate] {
    static T: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        ["qwen3-30b-a3b.jinja", "kimi-k2-instruct.jinja"]
            .iter()
            .map(|n| {
                let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("data").join(n);
                let src = std::fs::read_to_string(p).expect("template");
                ChatTemplate::new(&src).expect("published template compiles")
            })
            .collect()
    })
}

/// GGUF header parsing: Ok or a typed error; on Ok every getter works and every tensor lies
/// inside the image.
pub fn gguf(data: &[u8]) {
    if let Ok((md, tensors)) = check_image(data) {
        for (key, _) in md.iter() {
            let _ = md.get_u32(key);
            let _ = md.get_f32(key);
            let _ = md.get_str(key);
            let _ = md.get_str_array(key);
            let _ = md.get_i32_array(key);
        }
        for t in &tensors {
            assert!(
                t.offset() + t.size() <= data.len() as u64,
                "tensor beyond the image"
            );
        }
    }
}

/// Tokenizing any text: lossless round trips (batch and streaming decode), and protected
/// contents restore to the same text with no special token overlapping a protected range.
pub fn tokenize(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for f in fixtures() {
        let tok = &f.tok;
        for special in [false, true] {
            let ids = tok.encode(&text, false, special);
            assert_eq!(tok.decode(&ids), text);
            let mut d = StreamDecoder::new();
            let mut s: String = ids.iter().map(|&i| d.push(tok, i)).collect();
            s.push_str(&d.flush());
            assert_eq!(s, text);
        }
        for which in [Protect::All, Protect::Control] {
            let (back, plain) = tok.restore_content(&tok.protect_content(&text, which));
            assert_eq!(back, text, "protect/restore changed the text");
            let ids = tok.encode_with_plain(&back, false, &plain);
            assert_eq!(tok.decode(&ids), text);
            if which == Protect::All {
                assert!(
                    ids.iter().all(|&i| !tok.is_special(i)),
                    "a protected content produced a special token"
                );
            }
        }
    }
}

/// Splits fuzz bytes into chat messages: `role \x1f content` records separated by `\x1e`.
fn messages(data: &[u8]) -> Vec<ChatMessage> {
    let text = String::from_utf8_lossy(data);
    text.split('\u{1e}')
        .take(16)
        .map(|rec| match rec.split_once('\u{1f}') {
            Some((role, content)) => ChatMessage::new(role, content),
            None => ChatMessage::new("user", rec),
        })
        .collect()
}

/// Chat templates with hostile messages (any roles, any contents): rendering fails with a typed
/// error or succeeds; with contents protected, the prompt's text is unchanged and tokenizes
/// losslessly (the special tokens of contents are plain text; `tokenize` checks that part).
pub fn chat_template(data: &[u8]) {
    let msgs = messages(data);
    for f in fixtures() {
        let plain = f.template.render(&msgs, true, "", "");
        let guarded: Vec<ChatMessage> = msgs
            .iter()
            .map(|m| {
                ChatMessage::new(
                    m.role.clone(),
                    f.tok.protect_content(&m.content, Protect::All),
                )
            })
            .collect();
        let rendered = f.template.render(&guarded, true, "", "");
        if let (Ok(plain), Ok(rendered)) = (plain, rendered) {
            let (text, ranges) = f.tok.restore_content(&rendered);
            assert_eq!(text, plain, "protection changed the rendered text");
            let ids = f.tok.encode_with_plain(&text, false, &ranges);
            assert_eq!(f.tok.decode(&ids), text);
        }
    }
    for t in published() {
        let _ = t.render(&msgs, true, "<|endoftext|>", "<|im_end|>");
        let _ = t.render(&msgs, false, "", "");
    }
}

/// Chat templates themselves are untrusted (a GGUF's, `--chat-template`'s): any source compiles
/// or is a syntax error, and renders a conversation with a tool call, a tool result and tools
/// declared, or fails with a typed error; a template that loops or builds text without end
/// stops at its render budget (`chat::render_fuel`), so no input hangs the run or takes its
/// memory. The tool-call format found in it is one of the known ones or none.
pub fn template_source(data: &[u8]) {
    let src = String::from_utf8_lossy(data);
    let _ = nightshift_model::toolcall::ToolFormat::detect(&src);
    let Ok(t) = ChatTemplate::new(&src) else {
        return;
    };
    let tools = [
        serde_json::json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
    ];
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Weather in Oslo?"),
        ChatMessage {
            role: "assistant".into(),
            tool_calls: vec![nightshift_model::chat::ToolCall {
                id: "call_0".into(),
                name: "get_weather".into(),
                arguments: r#"{"city": "Oslo"}"#.into(),
            }],
            ..ChatMessage::default()
        },
        ChatMessage {
            role: "tool".into(),
            content: "12 C".into(),
            tool_call_id: Some("call_0".into()),
            name: Some("get_weather".into()),
            ..ChatMessage::default()
        },
    ];
    let opts = nightshift_model::chat::RenderOptions {
        tools: Some(&tools),
        add_generation_prompt: true,
        bos: "<s>",
        eos: "</s>",
        extra: None,
    };
    let _ = t.render_with(&msgs, &opts);
    let _ = t.render(&msgs[..2], false, "", "");
}

/// The node's request edge: any bytes decoded as a `ComputeRequest` and checked against a
/// store holding the fixture's experts; errors are statuses, never panics.
pub fn node_request(data: &[u8]) {
    static STORE: OnceLock<(ExpertStore, usize)> = OnceLock::new();
    let (store, n_embd) = STORE.get_or_init(|| {
        let f = &fixtures()[0];
        let shape = nightshift_model::shape::moe_shape(&f.gguf).expect("moe fixture");
        let store = ExpertStore::new(f.gguf.clone(), false);
        let all: Vec<(u32, u32)> = shape
            .moe_layers
            .iter()
            .flat_map(|&l| (0..shape.n_experts).map(move |e| (l as u32, e as u32)))
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool");
        store.load(&all, false, &pool).expect("load experts");
        let n_embd = f
            .gguf
            .tensors()
            .find(|t| t.name.ends_with("ffn_gate_exps.weight"))
            .and_then(|t| t.dims.first().copied())
            .expect("experts") as usize;
        (store, n_embd)
    });
    if let Ok(req) = nightshift_proto::v1::ComputeRequest::decode(data) {
        let _ = NodeService::check_request(store, *n_embd, req);
    }
}

fn fixture_shape() -> ModelShape {
    let s = nightshift_model::shape::moe_shape(&fixtures()[0].gguf).expect("moe fixture");
    ModelShape {
        moe_layers: s.moe_layers,
        n_experts: s.n_experts,
        expert_bytes: s.expert_bytes,
    }
}

/// Placement files: parse, then validate and resolve against the fixture's shape; a resolved
/// placement answers every lookup within range.
pub fn placement(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = Placement::nodes_from_toml_str(&text);
    let Ok(p) = Placement::from_toml_str(&text) else {
        return;
    };
    let shape = fixture_shape();
    let _ = p.validate(&shape);
    if let Ok(r) = p.resolve(&shape) {
        for &l in &shape.moe_layers {
            for e in 0..shape.n_experts {
                for &n in r.replicas(l, e) {
                    assert!(n < r.nodes.len(), "replica names no node");
                }
            }
        }
        let _ = r.to_toml_string();
    }
}

/// Atlas files (the header format and bare JSON): Ok or a typed error; an accepted atlas gives
/// statistics in range (a Gini of 15.9 is how overflowing counts showed).
pub fn atlas(data: &[u8]) {
    if let Ok(a) = Atlas::from_bytes(data) {
        let flat = nightshift_atlas::stats::flatten(a.preferred_counts());
        let g = nightshift_atlas::stats::gini(&flat);
        assert!(
            (0.0..=1.0).contains(&g) || flat.iter().all(|&c| c == 0),
            "gini {g}"
        );
        let c = nightshift_atlas::stats::coverage_at(&flat, 0.1);
        assert!((0.0..=1.0).contains(&c), "coverage {c}");
        let _ = a.preferred_counts().total_activations();
    }
}

/// `text` cut into stream chunks of about `stride` bytes (on character boundaries).
fn chunks(text: &str, stride: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let mut end = (at + stride).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[at..end]);
        at = end;
    }
    out
}

/// Generated text through the incremental tool-call parser of each format (the first byte picks
/// the format and how the text is cut into stream chunks): no panic, every call names a declared
/// tool and carries a JSON object as arguments, and the stream gives the same calls and the same
/// content (adjacent pieces joined) as the whole text at once; the reasoning split of the same
/// text likewise (the first byte's low bit: the prompt opened the think block).
pub fn tool_calls(data: &[u8]) {
    use nightshift_model::toolcall::{Parsed, ToolFormat, ToolParser, ToolSpec};
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let format = ToolFormat::ALL[usize::from(ctl) % ToolFormat::ALL.len()].0;
    let stride = 1 + usize::from(ctl >> 2);
    let text = String::from_utf8_lossy(rest);
    let tools = || {
        ["get_weather", "search"]
            .iter()
            .map(|n| ToolSpec {
                name: (*n).to_string(),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "q": {"type": "string"}}
                }),
                strict: false,
            })
            .collect::<Vec<_>>()
    };
    // Calls in order, and the content with adjacent pieces joined.
    let fold = |pieces: Vec<Parsed>| {
        let (mut calls, mut content) = (Vec::new(), String::new());
        for p in pieces {
            match p {
                Parsed::Content(c) => content.push_str(&c),
                Parsed::Call(c) => {
                    let args: serde_json::Value =
                        serde_json::from_str(&c.arguments).expect("arguments are JSON");
                    assert!(args.is_object(), "arguments {}", c.arguments);
                    assert!(
                        ["get_weather", "search"].contains(&c.name.as_str()),
                        "{}",
                        c.name
                    );
                    calls.push(c);
                    content.push('\u{0}');
                }
                Parsed::CallBegin { .. } | Parsed::CallArgs(_) => {
                    panic!("a streamed call from a parser that sends calls whole")
                }
            }
        }
        (calls, content)
    };
    let mut whole = ToolParser::new(format, tools());
    let mut a = whole.push(&text);
    a.extend(whole.finish());
    let mut streamed = ToolParser::new(format, tools());
    let mut b = Vec::new();
    for piece in chunks(&text, stride) {
        b.extend(streamed.push(piece));
    }
    b.extend(streamed.finish());
    assert_eq!(fold(a), fold(b), "format {format:?}, chunks of {stride}");
    // the same chunks through a parser that streams arguments: arguments only inside a call
    // that began, of a declared tool
    let mut live = ToolParser::new(format, tools()).streaming_arguments();
    let mut open = false;
    let mut check = |pieces: Vec<Parsed>| {
        for p in pieces {
            match p {
                Parsed::CallBegin { name, .. } => {
                    assert!(["get_weather", "search"].contains(&name.as_str()), "{name}");
                    open = true;
                }
                Parsed::CallArgs(_) => assert!(open, "arguments before a call began"),
                Parsed::Content(_) | Parsed::Call(_) => {}
            }
        }
    };
    for piece in chunks(&text, stride) {
        check(live.push(piece));
    }
    check(live.finish());
    // the reasoning split of the same text: the same pieces whole and in chunks
    use nightshift_model::reasoning::{Split, ThinkSplit};
    let join = |v: Vec<Split>| {
        let (mut r, mut c) = (String::new(), String::new());
        for s in v {
            match s {
                Split::Reasoning(x) => r.push_str(&x),
                Split::Content(x) => c.push_str(&x),
            }
        }
        (r, c)
    };
    let open = ctl & 1 == 1;
    let mut whole = ThinkSplit::new(open);
    let mut a = whole.push(&text);
    a.extend(whole.finish());
    let mut streamed = ThinkSplit::new(open);
    let mut b = Vec::new();
    for piece in chunks(&text, stride) {
        b.extend(streamed.push(piece));
    }
    b.extend(streamed.finish());
    assert_eq!(join(a), join(b), "reasoning split, chunks of {stride}");
}

/// The shared-memory link with a hostile peer on either side. A real client creates a region and
/// a real node end opens it; the input's edits (`[offset lo, offset hi, len, bytes..]`, offsets
/// within the header and the first bytes of each area) overwrite it as a corrupt or hostile
/// process could: before the node opens it (the header checks), after a request is posted (the
/// node's copy-out and length checks) or after it is answered (the client's checks of the
/// answer). Whatever the bytes: refusals and errors, never a read outside the region, a request
/// whose lengths disagree, or an answer that lists a pair twice or out of range.
pub fn shm_region(data: &[u8]) {
    use nightshift_proto::shm::{Incoming, ShmClient, ShmServer, ShmView, HEADER_BYTES};
    use std::time::{Duration, Instant};
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    // tmpfs when there is one (region files are made and removed per input)
    let dir = DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let d = base.join("nightshift-fuzz-regions");
        std::fs::create_dir_all(&d).expect("fuzz region dir");
        d
    });
    let Some((&mode, edits)) = data.split_first() else {
        return;
    };
    const REQ_CAP: usize = 4096;
    let Ok(mut client) = ShmClient::create_in(dir, REQ_CAP, 8192) else {
        return;
    };
    let path = client.path().to_path_buf();
    // the edits, written through the file (the same pages both ends map)
    let apply = |edits: &[u8]| {
        use std::os::unix::fs::FileExt;
        let Ok(f) = std::fs::OpenOptions::new().write(true).open(&path) else {
            return;
        };
        let mut rest = edits;
        while let [lo, hi, len, tail @ ..] = rest {
            let n = usize::from(*len).min(tail.len());
            // the header, and the first 2 KiB of the request and response areas
            let off = usize::from(u16::from_le_bytes([*lo, *hi])) % (3 * 2048);
            let at = match off {
                o if o < 2048 => o,
                o if o < 4096 => HEADER_BYTES + o - 2048,
                o => HEADER_BYTES + REQ_CAP + o - 4096,
            };
            let _ = f.write_all_at(&tail[..n], at as u64);
            rest = &tail[n..];
        }
    };
    if mode % 3 == 0 {
        apply(edits);
    }
    let Ok(mut node) = ShmServer::open_in(dir, &path) else {
        return;
    };
    let (n_embd, experts) = (8u32, vec![3u32, 1, 3]);
    let req = nightshift_proto::v1::ComputeRequest {
        request_id: 7,
        step_id: 0,
        layer: 1,
        act_type: 0,
        n_rows: 2,
        n_embd,
        experts: experts.clone(),
        rows: vec![0, 1, 1],
        acts: vec![5; 64],
        prefetch: Some(nightshift_proto::v1::PrefetchHint {
            layer: 2,
            experts: vec![1, 2],
        }),
        parts: false,
    };
    if client.post(&req).is_err() {
        return;
    }
    if mode % 3 == 1 {
        apply(edits);
    }
    match node.next(Duration::ZERO) {
        Ok(Some(Incoming::Request(r))) => {
            assert_eq!(r.experts.len(), r.rows.len(), "pairs and rows disagree");
            assert!(
                r.prefetch.as_ref().is_none_or(|h| !h.experts.is_empty()
                    && h.experts.len() <= nightshift_proto::shm::MAX_HINT_EXPERTS),
                "a hint read past the header"
            );
            assert!(
                8 * r.experts.len() + r.acts.len() <= REQ_CAP,
                "read past the area"
            );
            let n = r.experts.len() * r.n_embd as usize;
            if let Some(rows) = node.rows_mut() {
                assert_eq!(rows.len(), n);
                rows.fill(0.5);
                node.reply_rows(r.request_id, None);
            }
        }
        Ok(Some(Incoming::Malformed { request_id, reason })) => {
            assert!(!reason.is_empty());
            node.reply(
                request_id,
                &nightshift_proto::shm::ShmReply::Error {
                    code: 3,
                    message: reason,
                },
            );
        }
        Ok(None) | Err(_) => return,
    }
    if mode % 3 == 2 {
        apply(edits);
    }
    let deadline = Instant::now() + Duration::from_millis(1);
    match client.wait_view(deadline, &mut || true) {
        Ok(ShmView::Rows { rows, answered }) => {
            assert_eq!(rows.len(), experts.len() * n_embd as usize);
            if let Some(a) = answered {
                let mut seen = vec![false; experts.len()];
                for j in a {
                    let s = &mut seen[j as usize];
                    assert!(!*s, "pair {j} answered twice");
                    *s = true;
                }
            }
        }
        Ok(ShmView::Error { .. }) | Err(_) => {}
    }
}
