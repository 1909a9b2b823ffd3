"""Writes tokenizer-pre-ids.json: llama.cpp's ids for each pre-tokenizer on a vocabulary made to
show where it splits (a byte-level BPE whose merges join every adjacent byte pair of the
strings, so two bytes stay apart exactly at a piece boundary).

    pip install gguf llama-cpp-python   # (the parity sweep's venv has both)
    python tokenizer_pre_ids.py [OUT.json]

The GGUF files it tokenizes with are the tiny deepseek2 fixture's metadata with the tokenizer
replaced (no tensors: llama.cpp loads the vocabulary only). Read by tests/tokenizer_pre.rs.
"""
import json
import pathlib
import sys
import tempfile

import gguf
from llama_cpp import Llama

HERE = pathlib.Path(__file__).resolve().parent
PRES = ["deepseek-llm", "deepseek-coder", "deepseek-v3", "qwen2", "kimi-k2", "llama3", "gpt-2", "default"]
STRINGS = [
    "Hello world", "a  \n\n b", "12345 it's", "東京abc", "The quick brown fox, 3.14159!",
    "  leading and trailing  ", "über Straße ÀÖ øÿ ΑΩ \u1f7d \u2126 \u212a", "x\r\ny",
    "tabs\tand\u3000ideographic", "fn main() { println!(\"hi\"); }", "한국어 텍스트 123",
    "日本語のテキスト", "¿Qué? ¡Sí! «quotes» “curly” ‘single’", "a\u00a0b", "😀 emoji 😀😀",
    "MiXeD CaSe123abc456", "...---!!!", "line1\n\n\nline2   \n", "ｆｕｌｌｗｉｄｔｈ\u3000ＡＢＣ",
    "Ⅻ ² ½ ٣", "x = f(12); y += 3", "a,b;c:d", "word.\nNext", "  \t x", "$100 + 20% = ~30^2",
    "I'M here, you'RE there",
]


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main():
    out_path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "tokenizer-pre-ids.json"
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges, seen = [], set(tokens)
    for s in STRINGS:
        u = [b2u[b] for b in s.encode()]
        for a, b in zip(u, u[1:]):
            if a + b not in seen:
                seen.add(a + b)
                tokens.append(a + b)
                merges.append(a + " " + b)
    tokens += ["<BOS>", "<EOS>"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    out = {"source": "tests/data/tokenizer_pre_ids.py: llama.cpp (llama-cpp-python, vocab only), add_bos false, special false",
           "tokens": tokens, "merges": merges, "strings": STRINGS, "pre": {}}
    base = gguf.GGUFReader(HERE / "tiny-deepseek2-Q2_K.gguf", "r")
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRES:
            path = f"{tmp}/{pre}.gguf"
            w = gguf.GGUFWriter(path, arch="deepseek2", endianess=base.endianess)
            for field in base.fields.values():
                if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith(("GGUF.", "tokenizer.")):
                    continue
                if field.types[0] == gguf.GGUFValueType.ARRAY:
                    w.add_array(field.name, field.contents())
                else:
                    w.add_key_value(field.name, field.contents(), field.types[0])
            w.add_tokenizer_model("gpt2")
            w.add_tokenizer_pre(pre)
            w.add_token_list(tokens)
            w.add_token_types(types)
            w.add_token_merges(merges)
            w.add_bos_token_id(len(tokens) - 2)
            w.add_eos_token_id(len(tokens) - 1)
            w.add_add_bos_token(False)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            w.close()
            llm = Llama(model_path=path, vocab_only=True, verbose=False)
            out["pre"][pre] = [list(llm.tokenize(s.encode(), add_bos=False, special=False)) for s in STRINGS]
    out_path.write_text(json.dumps(out, ensure_ascii=True))
    print("wrote", out_path)


if __name__ == "__main__":
    main()
