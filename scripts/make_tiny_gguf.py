"""Write a tiny random-weight llama-architecture GGUF with a locally built
byte-level BPE vocab (256 byte tokens + a few specials + 4 merges).
Usage: python make_tiny_gguf.py out.gguf

Adapted from the project's shared example (shared/examples/make_tiny_gguf.py).
Needs the `gguf` and `numpy` packages; `scripts/llama-server.sh model tiny`
installs them into a tools venv in the cache and calls this script.

The weights are random (seeded, so the file is the same every time) and the
text it generates is random bytes: ask llama-server for
`"grammar": "root ::= [a-z ]+"` and `"ignore_eos": true` to get clean text of
an exact length. llama.cpp needs at least one BPE merge in the vocab.
"""

import os
import sys

if len(sys.argv) != 2:
    sys.exit(__doc__.splitlines()[2])

import gguf
import numpy as np

out = sys.argv[1]
if os.path.dirname(out):
    os.makedirs(os.path.dirname(out), exist_ok=True)
n_embd, n_head, n_head_kv, n_layer, n_ff, n_ctx = 64, 4, 4, 2, 128, 2048


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


b2u = bytes_to_unicode()
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
merges = ["h e", "\u0120 t", "i n", "t h"]
tokens = specials + [b2u[b] for b in range(256)] + [m.replace(" ", "") for m in merges]
toktypes = [gguf.TokenType.CONTROL] * len(specials) + [gguf.TokenType.NORMAL] * (256 + len(merges))
n_vocab = len(tokens)

w = gguf.GGUFWriter(out, "llama")
w.add_name("tiny-random-llama")
w.add_context_length(n_ctx)
w.add_embedding_length(n_embd)
w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff)
w.add_head_count(n_head)
w.add_head_count_kv(n_head_kv)
w.add_layer_norm_rms_eps(1e-5)
w.add_rope_dimension_count(n_embd // n_head)
w.add_vocab_size(n_vocab)
w.add_file_type(gguf.LlamaFileType.ALL_F32)
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("default")
w.add_token_list(tokens)
w.add_token_types(toktypes)
w.add_token_merges(merges)
w.add_bos_token_id(1)
w.add_eos_token_id(0)
w.add_add_bos_token(False)
w.add_chat_template(
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

rng = np.random.default_rng(0)


def r(*shape):
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


w.add_tensor("token_embd.weight", r(n_vocab, n_embd))
w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
w.add_tensor("output.weight", r(n_vocab, n_embd))
kv = n_embd // n_head * n_head_kv
for i in range(n_layer):
    p = f"blk.{i}."
    w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor(p + "attn_q.weight", r(n_embd, n_embd))
    w.add_tensor(p + "attn_k.weight", r(kv, n_embd))
    w.add_tensor(p + "attn_v.weight", r(kv, n_embd))
    w.add_tensor(p + "attn_output.weight", r(n_embd, n_embd))
    w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor(p + "ffn_gate.weight", r(n_ff, n_embd))
    w.add_tensor(p + "ffn_up.weight", r(n_ff, n_embd))
    w.add_tensor(p + "ffn_down.weight", r(n_embd, n_ff))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", out, "vocab", n_vocab)
