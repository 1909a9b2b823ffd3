//! Stored responses (`store`, default true): what `previous_response_id` continues and
//! `GET`/`DELETE /v1/responses/{id}` read. Each entry keeps its own request's input items, its
//! response and its parent's id, so a conversation is the chain of its ancestors and a long
//! session costs its own turns once, not once per turn. Bounded by entries and bytes;
//! the least recently used go first (a continued conversation touches its whole chain).

use super::types::{Item, ResponseObject};
use std::collections::HashMap;
use std::sync::Mutex;

/// Most responses kept.
pub const MAX_ENTRIES: usize = 10_000;
/// Most bytes (as JSON) kept.
pub const MAX_BYTES: usize = 512 << 20;

struct Entry {
    response: ResponseObject,
    input: Vec<Item>,
    parent: Option<String>,
    bytes: usize,
    used: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    bytes: usize,
    clock: u64,
}

/// Why a conversation cannot be continued.
#[derive(Debug, PartialEq, Eq)]
pub enum Missing {
    /// The id was never stored, was deleted, or was evicted.
    Unknown,
    /// An earlier response of the chain was deleted or evicted.
    Ancestor(String),
}

pub struct ResponseStore {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_bytes: usize,
}

impl Default for ResponseStore {
    fn default() -> Self {
        ResponseStore::new(MAX_ENTRIES, MAX_BYTES)
    }
}

impl ResponseStore {
    pub fn new(max_entries: usize, max_bytes: usize) -> ResponseStore {
        ResponseStore {
            inner: Mutex::new(Inner::default()),
            max_entries: max_entries.max(1),
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // a panic elsewhere cannot leave the map half-updated: every update is one insert or
        // remove
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps a finished response with the input items of its own request.
    /// A stored response's own input items (ids given to those sent without one).
    pub fn input(&self, id: &str) -> Option<Vec<Item>> {
        let g = self.lock();
        g.map.get(id).map(|e| e.input.clone())
    }

    pub fn put(&self, response: ResponseObject, mut input: Vec<Item>) {
        input.iter_mut().for_each(Item::ensure_id);
        let bytes = serde_json::to_string(&response).map_or(0, |s| s.len())
            + serde_json::to_string(&input).map_or(0, |s| s.len());
        if bytes > self.max_bytes {
            return;
        }
        let mut g = self.lock();
        g.clock += 1;
        let used = g.clock;
        let id = response.id.clone();
        let parent = response.previous_response_id.clone();
        if let Some(old) = g.map.insert(
            id,
            Entry {
                response,
                input,
                parent,
                bytes,
                used,
            },
        ) {
            g.bytes -= old.bytes;
        }
        g.bytes += bytes;
        while g.map.len() > self.max_entries || g.bytes > self.max_bytes {
            let Some(oldest) = g
                .map
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = g.map.remove(&oldest) {
                g.bytes -= e.bytes;
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<ResponseObject> {
        let mut g = self.lock();
        g.clock += 1;
        let now = g.clock;
        let e = g.map.get_mut(id)?;
        e.used = now;
        Some(e.response.clone())
    }

    pub fn delete(&self, id: &str) -> bool {
        let mut g = self.lock();
        match g.map.remove(id) {
            Some(e) => {
                g.bytes -= e.bytes;
                true
            }
            None => false,
        }
    }

    /// The whole conversation up to and including response `id`: each ancestor's input
    /// items then its output, oldest first.
    pub fn conversation(&self, id: &str) -> Result<Vec<Item>, Missing> {
        let mut g = self.lock();
        g.clock += 1;
        let now = g.clock;
        let mut chain = Vec::new();
        let mut at = Some(id.to_string());
        while let Some(cur) = at {
            let Some(e) = g.map.get_mut(&cur) else {
                return Err(if chain.is_empty() {
                    Missing::Unknown
                } else {
                    Missing::Ancestor(cur)
                });
            };
            e.used = now;
            at = e.parent.clone();
            chain.push(cur);
            if chain.len() > self.max_entries {
                break; // a chain cannot be longer than the store (no cycles)
            }
        }
        let mut items = Vec::new();
        for k in chain.iter().rev() {
            if let Some(e) = g.map.get(k) {
                items.extend(e.input.iter().cloned());
                items.extend(e.response.output.iter().cloned());
            }
        }
        Ok(items)
    }
}

#[cfg(test)]
mod tests {
    use super::super::types::*;
    use super::*;

    fn response(id: &str, parent: Option<&str>, out: &str) -> ResponseObject {
        ResponseObject {
            id: id.into(),
            object: "response",
            created_at: 0,
            status: "completed",
            error: None,
            incomplete_details: None,
            instructions: None,
            max_output_tokens: None,
            model: "m".into(),
            output: vec![Item::Message {
                id: None,
                role: "assistant".into(),
                content: MessageContent::Text(out.into()),
                status: None,
            }],
            parallel_tool_calls: true,
            previous_response_id: parent.map(String::from),
            reasoning: ReasoningConfig::default(),
            store: true,
            temperature: 1.0,
            text: TextOut {
                format: serde_json::json!({"type": "text"}),
            },
            tool_choice: serde_json::json!("auto"),
            tools: Vec::new(),
            top_p: 1.0,
            truncation: "disabled",
            usage: None,
            user: None,
            metadata: Default::default(),
        }
    }

    fn user(t: &str) -> Item {
        Item::Message {
            id: None,
            role: "user".into(),
            content: MessageContent::Text(t.into()),
            status: None,
        }
    }

    fn texts(items: &[Item]) -> Vec<String> {
        items
            .iter()
            .map(|i| match i {
                Item::Message {
                    content: MessageContent::Text(t),
                    ..
                } => t.clone(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_chain_is_its_ancestors_inputs_and_outputs_in_order() {
        let s = ResponseStore::default();
        s.put(response("r1", None, "a1"), vec![user("u1")]);
        s.put(response("r2", Some("r1"), "a2"), vec![user("u2")]);
        s.put(response("r3", Some("r2"), "a3"), vec![user("u3")]);
        assert_eq!(
            texts(&s.conversation("r3").unwrap()),
            ["u1", "a1", "u2", "a2", "u3", "a3"]
        );
        assert_eq!(texts(&s.conversation("r1").unwrap()), ["u1", "a1"]);
        assert_eq!(s.conversation("nope").err(), Some(Missing::Unknown));
        assert!(s.delete("r2"));
        assert!(!s.delete("r2"));
        assert_eq!(
            s.conversation("r3").err(),
            Some(Missing::Ancestor("r2".into()))
        );
        assert!(s.get("r2").is_none() && s.get("r3").is_some());
    }

    #[test]
    fn the_least_recently_used_go_first() {
        let s = ResponseStore::new(2, usize::MAX);
        s.put(response("a", None, "x"), vec![]);
        s.put(response("b", None, "y"), vec![]);
        assert!(s.get("a").is_some()); // a is now the most recent
        s.put(response("c", None, "z"), vec![]);
        assert!(s.get("b").is_none(), "b was the least recently used");
        assert!(s.get("a").is_some() && s.get("c").is_some());
        // a byte bound holds too
        let one = serde_json::to_string(&response("r0", None, "w"))
            .unwrap()
            .len()
            + 2;
        let s = ResponseStore::new(100, one * 2);
        for k in 0..5 {
            s.put(response(&format!("r{k}"), None, "w"), vec![]);
        }
        let kept = (0..5).filter(|k| s.get(&format!("r{k}")).is_some()).count();
        assert_eq!(kept, 2);
    }
}
