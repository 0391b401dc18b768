"""The reference engine's 46 buffers as data: the one place they are written.

Each record gives a buffer's name, what it holds, its element type and shape,
its byte size as an expression over the symbols of `metrale.formulas` (the
formulas of docs/buffers.md), its size in words, which helpers cover it and
which accessors the arena compiles for it.  Plain data below every other
module: the set layer builds `REFERENCE` from it (`metrale.buffers`), the spec
rules read which buffers have compiled accessors, and the build reads it for
the arena's accessors and stubs (tools/gen_buffers.py).  Everything else
derives from those: the sizing (`metrale.sizes`), the C layout's buffer ids
and helper groups, the catalogue (`metrale.catalogue`, ``metrale plan
--explain``) and docs/buffers.md (tools/gen_docs.py).  The order is the
canonical order.

A data table (the 600-line rule exempts it).  Adding a reference buffer is one
record here plus its test expectations: docs/buffer-sets.md shows how.
"""

from .._base._dtypes import ITEMSIZE as _ITEMSIZE

__all__ = ["RECORDS"]


def _spec(name, holds, dtype, shape, formula, words, *, itemsize=None, note="", exact=True,
          when=None, floor=None, families="every model", empty="", zero_all=False,
          rows="whole", prefill=False, checksum=False, total=True, accessors=(),
          init_zero=False, step=""):
    # Every field of a BufferSpec, stored as it stores them.  The records are
    # checked through the BufferSpec constructor by the tests
    # (tests/test_buffers.py); building them unchecked keeps the import cheap.
    if itemsize is None and dtype is not None:
        itemsize = _ITEMSIZE[dtype]
    return dict(
        name=name, dtype=dtype, itemsize=itemsize, shape=shape, shape_exact=exact,
        shape_when=when, size=formula, formula=formula, floor=floor, zero_all=zero_all,
        prefill=prefill, rows=rows, checksum=checksum, total=total, align=256,
        accessors=accessors, init_zero=init_zero, step=step, holds=holds, words=words, dtype_note=note,
        families=families, empty=empty, wake="zero", tag="default")


_DENSE_NOTE = "dense models (E = 0)"

_FLOOR_EMPTY = ("Never 0: the 256-byte floor keeps it allocated even when none of its users "
                "exists in the model.")
_PLACEHOLDER_DENSE = ("A dense model (E = 0) gets a 256-byte placeholder that no kernel reads, "
                      "so the pointer is never NULL.")

RECORDS = (
    _spec("hidden_states",
          "The residual-stream activations that enter and leave every layer: one BF16 row of H "
          "values per token of the pass.",
          "bfloat16", "[M, H]", "2*M*H", "M rows of H BF16 values.",
          zero_all=True, rows="M", prefill=True, checksum=True, accessors=("pointer",)),
    _spec("residual",
          "The running residual sum each layer adds its output to (the skip connection), kept "
          "beside hidden_states in the same [M, H] BF16 form.",
          "bfloat16", "[M, H]", "2*M*H", "M rows of H BF16 values.",
          zero_all=True, rows="M", prefill=True, checksum=True, accessors=("pointer",)),
    _spec("norm_output",
          "RMS-norm output, the input of the projections that follow. It is max(H, Di) wide "
          "because a Mamba-2 layer normalizes d_inner-wide rows, which can exceed the model "
          "width. norm_output_bytes() is the bound the attention-prefill o_proj cuBLASLt arm "
          "checks its ceil16(M) rows against.",
          "bfloat16", "[M, max(H, Di)]", "2*M*max(H, Di)", "M rows of max(H, Di) BF16 values.",
          families="every model; wider for Mamba-2 hybrids whose d_inner exceeds H",
          zero_all=True, rows="M", checksum=True, accessors=("pointer", "bytes")),
    _spec("qkv_output",
          "The fused Q/K/V projection output: per token the query heads (each followed by its "
          "output gate when the attention is gated), then K, then V. It has Mp = ceil16(M) rows "
          "because the cuBLASLt prefill arm writes padded rows; qkv_output_bytes() also bounds "
          "the multi-sequence W8A8 decode arm.",
          "bfloat16", "[Mp, (g*Hq + 2*Hkv)*D]", "2*Mp*(g*Hq + 2*Hkv)*D",
          "Mp rows of g*Hq + 2*Hkv heads of D BF16 values.",
          families="every model; g = 2 for gated attention (Qwen3-Next)",
          zero_all=True, rows="Mp", checksum=True, accessors=("pointer", "bytes")),
    _spec("attn_output",
          "Attention output before o_proj. Mamba-2 layers put their d_inner rows here and "
          "absorbed-MLA layers their [M, Hq, KVr + r] latent result, so it is as wide as the "
          "widest of the three.",
          "bfloat16", "[M, max(Hq*D, Di, Hq*(KVr + r) if KVr > 0 else 0)]",
          "2*M*max(Hq*D, Di, Hq*(KVr + r) if KVr > 0 else 0)",
          "M rows of BF16, as wide as the widest of Hq*D, Di and (MLA only) Hq*(KVr + r).",
          families="every model; widened by Mamba-2 (Di) and MLA (Hq*(KVr + r))",
          zero_all=True, rows="M", checksum=True, accessors=("pointer", "bytes")),
    _spec("gate_logits",
          "BF16 router scores: per token one column per routed expert plus one per zero expert "
          "(an expert with no FFN that the router may still pick). zero_prefill_essentials clears "
          "it because stale expert indices left by an earlier request once caused out-of-bounds "
          "expert access.",
          "bfloat16", "[M, E + Ez]", "2*M*(E + Ez) if E > 0 else 256",
          "MoE: M rows of E + Ez BF16 scores; dense: a 256-byte placeholder.",
          when="E > 0", families="MoE models; a placeholder for " + _DENSE_NOTE,
          empty=_PLACEHOLDER_DENSE,
          zero_all=True, rows="M", prefill=True, checksum=True, accessors=("pointer", "bytes")),
    _spec("gate_logits_f32",
          "FP32 router scores for the FP32-gate path, where top-k is taken on unrounded logits. "
          "Every MoE model gets it; the lever that selects the path belongs to the engine, not "
          "to the sizing.",
          "float32", "[M, E + Ez]", "4*M*(E + Ez) if E > 0 else 256",
          "MoE: M rows of E + Ez FP32 scores; dense: a 256-byte placeholder.",
          when="E > 0", families="MoE models; a placeholder for " + _DENSE_NOTE,
          empty=_PLACEHOLDER_DENSE,
          accessors=("pointer",)),
    _spec("moe_router_in_f32",
          "The router's input rows widened to FP32, for the FP32-routing path where the router "
          "GEMM runs in FP32. Every MoE model gets it.",
          "float32", "[M, H]", "4*M*H if E > 0 else 256",
          "MoE: M rows of H FP32 values; dense: a 256-byte placeholder.",
          when="E > 0", families="MoE models; a placeholder for " + _DENSE_NOTE,
          empty=_PLACEHOLDER_DENSE,
          accessors=("pointer",)),
    _spec("moe_output",
          "Output of the MoE block, or of the dense FFN, before it joins the residual. Mp rows "
          "because the cuBLASLt dense-FFN down projection writes padded rows here.",
          "bfloat16", "[Mp, H]", "2*Mp*H", "Mp rows of H BF16 values.",
          zero_all=True, rows="Mp", prefill=True, checksum=True, accessors=("pointer", "bytes")),
    _spec("logits",
          "Output of the final vocabulary projection. It has Lr rows, not M: enough for a "
          "batched speculative verify (VERIFY_ROW_CAP = 160 rows) or a mixed decode step (R "
          "decode rows plus one prefill row), whichever is more, and never more than M.",
          "bfloat16", "[Lr, V]", "2*Lr*V", "Lr rows of V BF16 values, Lr = min(M, max(160, R + 1)).",
          families="every model (V); rows grow with max_batch_size above 159",
          zero_all=True, accessors=("pointer", "bytes")),
    _spec("ssm_qkvz",
          "Multi-use BF16 scratch sized for the largest of its users: the GDN QKVZ projection "
          "output (Mp rows, cuBLASLt arm), the Mamba-2 in_proj output [M, Dip], the prefill K and "
          "V of an attention layer (K from row 0, V from row M, the V block Mp rows tall on the "
          "cuBLASLt arm) and the MoE shared-expert up output [M, Is].",
          "bfloat16", "[Mp, QKVZ] or [M, Dip] or [M + Mp, Hkv*D] or [M, Is]",
          "max(2*Mp*QKVZ, 2*M*Dip, 2*(M + Mp)*Hkv*D, 2*M*Is, 256)",
          "The largest of its uses in BF16: Mp rows of QKVZ, M rows of Dip, M + Mp rows of "
          "Hkv*D, M rows of Is; at least 256 bytes.",
          exact=False, floor=256,
          families="every model; sized by GDN hybrids (QKVZ), Mamba-2 (Dip), attention (Hkv*D) "
                   "and shared experts (Is)",
          empty=_FLOOR_EMPTY,
          zero_all=True, rows="M|Mp", checksum=True, accessors=("pointer", "bytes")),
    _spec("ssm_ba",
          "Multi-use BF16 scratch: the GDN b and a values (2*nv per token), the LatentMoE latent "
          "rows [M, Lm] and, on MLA models, the q latent [M, Qr] and later the K rope rows "
          "[M, r], one at a time.",
          "bfloat16", "[M, 2*nv] or [M, Lm] or [M, max(r, Qr)]",
          "max(4*M*nv, 2*M*Lm, 2*M*max(r, Qr) if KVr > 0 else 0, 256)",
          "The largest of, in BF16: M rows of 2*nv, M rows of Lm, (MLA) M rows of max(r, Qr); "
          "at least 256 bytes.",
          exact=False, floor=256, families="GDN hybrids, LatentMoE and MLA models; the floor "
                                           "elsewhere",
          empty="The 256-byte floor when the model has no GDN, LatentMoE or MLA layer (and "
                "whenever those uses are smaller).",
          zero_all=True, rows="M", checksum=True, accessors=("pointer",)),
    _spec("ssm_deinterleaved",
          "Multi-use BF16 scratch: the GDN [Q|K|V|Z] rows after deinterleaving (also the QKVZ "
          "destination of models whose projection is already sequential, Mp rows), the Mamba-2 "
          "xBC rows [M, Dx], the query heads [M, Hq*D] and the absorbed-MLA query "
          "[M, Hq, KVr + r].",
          "bfloat16", "[Mp, QKVZ] or [M, Dx] or [M, Hq*D] or [M, Hq*(KVr + r)]",
          "max(2*Mp*QKVZ, 2*M*Dx, 2*M*Hq*D, 2*M*Hq*(KVr + r) if KVr > 0 else 0, 256)",
          "The largest of, in BF16: Mp rows of QKVZ, M rows of Dx, M rows of Hq*D, (MLA) M "
          "rows of Hq*(KVr + r); at least 256 bytes.",
          exact=False, floor=256, families="every model (query heads); GDN, Mamba-2 and MLA "
                                           "widen it",
          empty=_FLOOR_EMPTY,
          zero_all=True, rows="M|Mp", checksum=True, accessors=("pointer", "bytes")),
    _spec("ssm_gates",
          "FP32 GDN gates: per token nv gate values followed by nv beta values.",
          "float32", "[M, 2*nv]", "max(8*M*nv, 256)",
          "M rows of 2*nv FP32 values, at least 256 bytes.",
          floor=256, families="GDN hybrids (Qwen3-Next, GLM-5.3); the floor elsewhere",
          empty="The 256-byte floor when the model has no GDN layer (nv = 0).",
          zero_all=True, rows="M", checksum=True, accessors=("pointer",)),
    _spec("ssm_conv_out_f32",
          "FP32 output of the GDN causal conv1d, QKVZ wide. MLA models borrow it for their BF16 "
          "query rope rows [M, Hq*r].",
          "float32", "[M, QKVZ]", "max(4*M*QKVZ, 2*M*Hq*r if KVr > 0 else 0, 256)",
          "M rows of QKVZ FP32 values, or (MLA) M rows of Hq*r BF16 values when that is more; "
          "at least 256 bytes.",
          note="MLA models write BF16 rope rows into it", when="KVr == 0", floor=256,
          families="GDN hybrids and MLA models; the floor elsewhere",
          empty="The 256-byte floor when the model has neither GDN layers nor MLA rope rows.",
          zero_all=True, rows="M", checksum=True, accessors=("pointer",)),
    _spec("scratch",
          "Byte scratch shared by users that never run at the same moment, each uploading its "
          "own layout first: the MoE top-k indices and weights followed by the prefill chunk "
          "metadata; the batched decode and speculative-verify metadata at byte offset 32,768 "
          "(DecodeMetaLayout arithmetic); and the kernel-batched prefill staging for 8 streams.",
          None, "bytes (overlapping layouts)", "max(65536, prefill_term, decode_term, q12_term)",
          "The largest of the prefill term (routing plus prefill metadata), the decode term "
          "(32 KiB plus the wider of the verify and decode metadata) and the kernel-batched "
          "prefill term; at least 64 KiB.",
          note="raw bytes: U32 / I32 / I64 metadata and the FP32 routing weights, in layouts "
               "that overlap",
          exact=False, floor=65536, empty="Never 0: at least 64 KiB.",
          zero_all=True, accessors=("pointer", "bytes"), step="decode_meta"),
    _spec("expert_gate_out",
          "Gate projection output of the routed top-k experts, k*Im wide per token, or I wide "
          "when a dense layer of a mixed model is wider; Kx rows. A dense model has it too: its "
          "FFN writes the gate output here (the expert buffers double as the dense FFN's), "
          "which is why it is I wide when E = 0.",
          "bfloat16", "[Kx, I if E == 0 else max(k*Im, I)]",
          "2*Kx*(I if E == 0 else max(k*Im, I))",
          "Kx rows of BF16, w wide: w = max(k*Im, I) for MoE, I for a dense model.",
          families="every model: MoE experts and the dense FFN",
          zero_all=True, rows="Mp", prefill=True, checksum=True, accessors=("pointer", "bytes")),
    _spec("expert_up_out",
          "Up projection output, the partner of expert_gate_out: the same shape in a separate "
          "buffer, because the activation reads gate and up together. Dense models use it for "
          "the dense FFN's up projection.",
          "bfloat16", "[Kx, I if E == 0 else max(k*Im, I)]",
          "2*Kx*(I if E == 0 else max(k*Im, I))",
          "The same as expert_gate_out: Kx rows of max(k*Im, I) (MoE) or I (dense) BF16 values.",
          families="every model: MoE experts and the dense FFN",
          zero_all=True, rows="Mp", prefill=True, checksum=True, accessors=("pointer",)),
    _spec("expert_down_out",
          "Down projection output of the top-k experts, one Hin-wide slice per routed expert "
          "(Hin is the LatentMoE latent width when the model has one, else H), or the dense "
          "FFN's H-wide output.",
          "bfloat16", "[Kx, H if E == 0 else k*Hin]", "2*Kx*H if E == 0 else 2*Kx*k*Hin",
          "Kx rows of BF16: k*Hin wide for MoE, H wide for a dense model.",
          families="every model: MoE experts (LatentMoE narrows Hin) and the dense FFN",
          zero_all=True, rows="Mp", prefill=True, checksum=True, accessors=("pointer", "bytes")),
    _spec("splitk_workspace",
          "Partial results of the split-K paged-decode attention: one slot per (sequence, "
          "q-head, split) holding D partial outputs, the running max and the running sum. Sized "
          "for R, the widest batch the decode metadata accepts, with the policy resolver the "
          "launch uses: a short workspace would be a silent out-of-bounds write.",
          "float32", "[slots, D + 2]", "4*(D + 2)*slots",
          "slots of D + 2 FP32 values; slots = sm_count under the legacy policy, else "
          "R*Hq*splits.",
          families="every model; the policy comes from the target and METRALE_ATTN_DECODE_SPLITK",
          zero_all=True, checksum=True, accessors=("pointer",)),
    _spec("o_latent",
          "Latent output of the grouped O projection: o_groups groups of rank o_lora_rank per "
          "token. No helper zeroes it and total_bytes() leaves it out, as the reference "
          "preflight does.",
          "bfloat16", "[M, o_groups*o_lora_rank]", "max(2*M*o_groups*o_lora_rank, 256)",
          "M rows of o_groups*o_lora_rank BF16 values, at least 256 bytes.",
          floor=256, families="models with a grouped O projection; the floor elsewhere",
          empty="The 256-byte floor when the model has no grouped O projection (o_groups or "
                "o_lora_rank is 0).",
          total=False, accessors=("pointer",)),
    _spec("norm_unit_w",
          "An all-zero BF16 weight row. The RMS-norm kernel scales by (1 + w), so passing this "
          "weight gives a plain normalization. Zero-filled once at construction; no helper "
          "touches it again, and total_bytes() leaves it out.",
          "bfloat16", "[max(H, Di)]", "2*max(H, Di)", "max(H, Di) BF16 values.",
          total=False, accessors=("pointer",), init_zero=True),
    _spec("hc_streams",
          "Hyper-connection residual streams: hc parallel FP32 copies of the hidden row per "
          "token.",
          "float32", "[M, hc, H]", "4*M*hc*H if hc > 0 else 256",
          "hc > 0: M rows of hc*H FP32 values; else a 256-byte placeholder.",
          when="hc > 0", families="hyper-connection models (DeepSeek-V4, GLM-5.3)",
          empty="A 256-byte placeholder when the model has no hyper-connections (hc = 0).",
          accessors=("pointer",)),
    _spec("hc_post",
          "Hyper-connection post weights: hc FP32 values per token that spread a layer's output "
          "over the streams.",
          "float32", "[M, hc]", "max(4*M*hc, 256) if hc > 0 else 256",
          "hc > 0: M rows of hc FP32 values, at least 256 bytes; else a 256-byte placeholder.",
          when="hc > 0", floor=256, families="hyper-connection models (DeepSeek-V4, GLM-5.3)",
          empty="A 256-byte placeholder when hc = 0.",
          accessors=("pointer",)),
    _spec("hc_comb",
          "Hyper-connection combination matrix: hc x hc FP32 values per token that mix the "
          "streams.",
          "float32", "[M, hc, hc]", "max(4*M*hc*hc, 256) if hc > 0 else 256",
          "hc > 0: M rows of hc*hc FP32 values, at least 256 bytes; else a 256-byte placeholder.",
          when="hc > 0", floor=256, families="hyper-connection models (DeepSeek-V4, GLM-5.3)",
          empty="A 256-byte placeholder when hc = 0.",
          accessors=("pointer",)),
    _spec("hc_lowrank_scratch",
          "Scratch of the low-rank hyper-connection kernels, one layout at a time: up to 64 "
          "tokens (decode) FP32 normed [64, hc*H] then low [64, hr]; longer passes, in slabs of "
          "Ts = min(M, 2048) tokens, BF16 normed and up_pre [Ts, hc*H], low [Ts, hr] and "
          "inj_pre [Ts, hc] back to back.",
          None, "two layouts (see holds)",
          "max(4*min(M, 64)*(hc*H + hr), 2*min(M, 2048)*(2*hc*H + hr + hc)) "
          "if hc > 0 and hr > 0 else 256",
          "hc > 0 and hr > 0: the larger of the decode layout (4 bytes x min(M, 64) rows x "
          "(hc*H + hr)) and the prefill layout (2 bytes x min(M, 2048) rows x (2*hc*H + hr + "
          "hc)); else a 256-byte placeholder.",
          note="FP32 in the decode layout, BF16 in the prefill layout", exact=False,
          families="low-rank hyper-connection models (hc_lowrank > 0)",
          empty="A 256-byte placeholder unless the model has low-rank hyper-connections "
                "(hc > 0 and hr > 0); no bundled preset sets hc_lowrank.",
          accessors=("pointer",)),
    _spec("qsa_select_scratch",
          "QSA indexer prefill token-selection scratch, shared by every indexer layer (single "
          "stream): 2,048 rows of BF16 qk [(nh + 1)*hdi], FP32 q_post [nh*hdi], FP32 scores "
          "[ceil(max_seq_len/icr)] and I32 selected-token lists [topk // icr], back to back.",
          None, "four regions of 2048 rows (see holds)",
          "2048*(2*(nh + 1)*hdi + 4*nh*hdi + 4*cdiv(max_seq_len, icr) + 4*(topk // icr)) "
          "if topk > 0 and icr > 0 else 256",
          "topk > 0 and icr > 0: 2,048 rows of 2*(nh + 1)*hdi + 4*nh*hdi + "
          "4*ceil(max_seq_len/icr) + 4*(topk // icr) bytes; else a 256-byte placeholder.",
          note="BF16 qk, FP32 q_post and scores, I32 lists", exact=False,
          families="QSA-indexer models with a compression ratio (index_topk and "
                   "index_compress_ratio > 0)",
          empty="A 256-byte placeholder unless topk > 0 and icr > 0. The DeepSeek-V4 and "
                "GLM-5.3 presets set index_topk but leave index_compress_ratio at 0, so they "
                "get the placeholder.",
          accessors=("pointer",)),
    _spec("ssd_scratch",
          "Mamba-2 SSD chunked-scan scratch over 64-token chunks: FP32 dt and dA_cumsum "
          "[Hm, nc, 64] and the chunk matrices CB [nc, G, 64, 64], G = max(n_groups, 1).",
          "float32", "[Hm, nc, 64] x 2, then [nc, max(n_groups, 1), 64, 64]",
          "2*(Hm*nc*64*4) + nc*max(n_groups, 1)*64*64*4 if Hm > 0 and ssm_state_size > 0 else 0",
          "Mamba-2: two FP32 [Hm, nc, 64] arrays plus FP32 [nc, G, 64, 64], nc = ceil(M/64) + 1; "
          "else 0.",
          exact=False, families="Mamba-2 hybrids (Nemotron-H)",
          empty="0 bytes and NULL without Mamba-2 layers (Hm = 0 or ssm_state_size = 0).",
          accessors=("pointer",)),
    _spec("gdn_fla_scratch",
          "GDN FLA chunked-prefill scratch over 64-token chunks, with 16 spare chunks for the "
          "batched FLA path (one per stream, up to 16 streams): BF16 W, U, S and uc regions and "
          "FP32 gc, for X (chunk, value head) pairs.",
          None, "five regions (see holds)",
          "2*X*64*dk + 2*X*64*dv + 2*X*dk*dv + 2*X*64*dv + 4*X*64 "
          "if nv > 0 and dk == 128 and dv == 128 else 0",
          "GDN with dk = dv = 128: BF16 W [X, 64, dk], U [X, 64, dv], S [X, dk, dv], uc "
          "[X, 64, dv] and FP32 gc [X, 64], X = (ceil(M/64) + 16)*nv; else 0.",
          note="BF16 W / U / S / uc, FP32 gc", exact=False,
          families="GDN hybrids with 128-wide key and value heads (Qwen3-Next, GLM-5.3)",
          empty="0 bytes and NULL without GDN layers, or when the GDN heads are not 128 wide "
                "(the FLA kernels are built for dk = dv = 128 only).",
          accessors=("pointer",)),
    _spec("token_ids",
          "U32 token ids of the pass, read by hash-routed MoE layers (token id to expert "
          "lookup). The engine uploads them before the layer loop, and before each replay of a "
          "captured decode graph.",
          "uint32", "[M]", "max(4*M, 256)", "M U32 ids, at least 256 bytes.", floor=256,
          accessors=("pointer",), step="token_ids"),
    _spec("ffn_act_q8",
          "q8_1-quantized activations of the dense FFN's Q4_K MMQ path: M rows of ceil256(Kf) "
          "values at 4 bytes each, plus 1 MiB of slack.",
          None, "[M, ceil256(Kf)] at 4 bytes, + 1 MiB",
          "4*M*ceil256(Kf) + 1048576 if E == 0 else 0",
          "Dense: 4 bytes x M rows x ceil256(Kf), plus 1 MiB; MoE: 0.",
          note="q8_1 blocks (int8 values with a per-block scale and sum), sized at 4 bytes per "
               "value plus slack",
          exact=False, families=_DENSE_NOTE,
          empty="0 bytes and NULL for MoE models: only the dense FFN quantizes its activations "
                "here.",
          accessors=("pointer",)),
    _spec("ffn_act_a",
          "Quantized dense-FFN activations: int8 [Mp, Kf]. The NVFP4 path packs [M, Kf/2] and "
          "the FP8 path [M, Kf] into the same bytes.",
          "int8", "[Mp, Kf]", "Mp*Kf if E == 0 else 0", "Dense: Mp rows of Kf bytes; MoE: 0.",
          note="also NVFP4 packed [M, Kf/2] or FP8 [M, Kf]", when="E == 0",
          families=_DENSE_NOTE, empty="0 bytes and NULL for MoE models.",
          accessors=("pointer", "bytes")),
    _spec("ffn_act_scale",
          "Activation scales of the dense FFN: one 4-byte word per 32 values, [Mp, Kf // 32] "
          "(floor division, as the reference engine). The NVFP4 [M, Kf/16] and FP8 "
          "[M, Kf/128] scales use the same bytes.",
          None, "[Mp, Kf // 32]", "4*Mp*(Kf // 32) if E == 0 else 0",
          "Dense: Mp rows of Kf // 32 four-byte scales (floor division); MoE: 0.",
          itemsize=4, note="4-byte scale words, also reused for the NVFP4 and FP8 scales",
          when="E == 0", families=_DENSE_NOTE, empty="0 bytes and NULL for MoE models.",
          accessors=("pointer", "bytes")),
    _spec("ffn_act_scale_kmajor",
          "The dense FFN's FP8 activation scales transposed to token-contiguous order, "
          "[Kf // 128, Mp], as the cuBLASLt block-scaled FFN GEMM reads them.",
          "float32", "[Kf // 128, Mp]", "4*Mp*(Kf // 128) if E == 0 else 0",
          "Dense: Kf // 128 rows of Mp FP32 scales (floor division); MoE: 0.",
          when="E == 0", families=_DENSE_NOTE, empty="0 bytes and NULL for MoE models.",
          accessors=("pointer", "bytes")),
    _spec("ffn_gate_up_fused",
          "BF16 output of the fused dense gate+up decode GEMM for up to GATEUP_FUSED_MAX_M = 16 "
          "rows; a row is [gate, up] with up at column I. A buffer of its own because widening "
          "expert_gate_out for this decode band would cost M rows; sized for every dense model, "
          "whether or not the fused arm runs.",
          "bfloat16", "[16, 2*I]", "2*16*2*I if E == 0 else 0",
          "Dense: 16 rows of 2*I BF16 values (64*I bytes); MoE: 0.",
          when="E == 0", families=_DENSE_NOTE, empty="0 bytes and NULL for MoE models.",
          accessors=("pointer", "bytes")),
    _spec("fp8_act",
          "FP8 (E4M3) activations of the prefill projections, Kp wide: the widest K among the "
          "hidden-input projections (q/k/v, GDN qkvz), o_proj (Hq*D), the Mamba-2 out_proj "
          "(Di) and the GDN out_proj (Vd).",
          "float8_e4m3fn", "[Mp, Kp]", "Mp*Kp", "Mp rows of Kp FP8 bytes.",
          accessors=("pointer", "bytes")),
    _spec("moe_fp8_scratch",
          "One slab reused in turn by every grouped FP8 MoE layer: FP8 activations, FP32 "
          "scales, the 128 x 64 tile worklist and its counter, and an adaptive small worklist "
          "when E = 256. It has no pointer accessor: arena.moe_fp8_scratch(config, rows) gives "
          "the region addresses.",
          None, "slab of 256-aligned regions", "moe_fp8_bytes if E > 0 else 0",
          "MoE: the FP8 MoE layout for M rows (activations, scales, worklist and counter, each "
          "256-aligned, plus the small worklist when E = 256); dense: 0.",
          note="FP8 activations, FP32 scales, 8-byte work items and 4-byte counters",
          exact=False, families="MoE models",
          empty="0 bytes and NULL for " + _DENSE_NOTE + ": there are no grouped experts.",
          accessors=()),
    _spec("fp8_act_scale",
          "FP32 scales of fp8_act, one per 128 activations (ceiling division, so a ragged last "
          "block has its scale).",
          "float32", "[Mp, cdiv(Kp, 128)]", "4*Mp*cdiv(Kp, 128)",
          "Mp rows of ceil(Kp/128) FP32 scales.",
          accessors=("pointer", "bytes")),
    _spec("fp8_act_scale_kmajor",
          "The transpose of fp8_act_scale (token-contiguous) for cuBLASLt. A separate buffer "
          "because the transpose is written while the source is still live.",
          "float32", "[cdiv(Kp, 128), Mp]", "4*Mp*cdiv(Kp, 128)",
          "ceil(Kp/128) rows of Mp FP32 scales.",
          accessors=("pointer", "bytes")),
    _spec("q2_dequant_scratch",
          "BF16 staging into which each keep-packed GGUF Q2_0 projection is dequantized in turn: "
          "large enough for the biggest projection that has H as one dimension. Independent of "
          "M.",
          "bfloat16", "[H, max(I, QKVZ, Dip, g*Hq*D, 2*Hkv*D)]",
          "2*H*max(I, QKVZ, Dip, g*Hq*D, 2*Hkv*D) if gguf_native_q2 else 0",
          "Lever on: H x max(I, QKVZ, Dip, g*Hq*D, 2*Hkv*D) BF16 values; else 0.",
          when="gguf_native_q2", families="every model, when the lever is on",
          empty="0 bytes and NULL unless METRALE_GGUF_NATIVE_Q2 is exactly \"1\".",
          accessors=("pointer", "bytes")),
    _spec("lora_xa",
          "LoRA shrink output x*A^T: rank values per token.",
          "bfloat16", "[M, rank]", "2*M*rank if rank > 0 else 0",
          "With adapters: M rows of rank BF16 values; else 0.",
          when="rank > 0", families="any model served with LoRA adapters (adapter_max_rank > 0)",
          empty="0 bytes and NULL without adapters (rank = 0).",
          accessors=("pointer", "bytes")),
    _spec("lora_delta",
          "LoRA expand output, the low-rank update added to a projection's output: as wide as "
          "the widest target projection.",
          "bfloat16", "[M, max(H, I, g*Hq*D)]", "2*M*max(H, I, g*Hq*D) if rank > 0 else 0",
          "With adapters: M rows of max(H, I, g*Hq*D) BF16 values; else 0.",
          when="rank > 0", families="any model served with LoRA adapters (adapter_max_rank > 0)",
          empty="0 bytes and NULL without adapters (rank = 0).",
          accessors=("pointer", "bytes")),
    _spec("lora_hact",
          "LoRA hidden activation [M, I] for adapters on the dense FFN.",
          "bfloat16", "[M, I]", "2*M*I if rank > 0 else 0",
          "With adapters: M rows of I BF16 values; else 0.",
          when="rank > 0", families="any model served with LoRA adapters (adapter_max_rank > 0)",
          empty="0 bytes and NULL without adapters (rank = 0), and also with adapters when the "
                "model has no dense FFN (I = 0, e.g. DeepSeek-V4).",
          accessors=("pointer", "bytes")),
    _spec("lora_seq_slot",
          "Adapter slot of each prefill token. A buffer of its own so that it can never overlap "
          "the metadata regions of scratch.",
          "int32", "[M]", "4*M if rank > 0 else 0", "With adapters: M I32 values; else 0.",
          when="rank > 0", families="any model served with LoRA adapters (adapter_max_rank > 0)",
          empty="0 bytes and NULL without adapters (rank = 0).",
          accessors=("pointer",)),
    _spec("q2_act_q8",
          "q8_1 activations of the keep-packed Q2_0 MMQ prefill: the ffn_act_q8 rule with "
          "K = max(H, I, Hq*D).",
          None, "[M, ceil256(max(H, I, Hq*D))] at 4 bytes, + 1 MiB",
          "4*M*ceil256(max(H, I, Hq*D)) + 1048576 if gguf_native_q2_mmq else 0",
          "Lever on: 4 bytes x M rows x ceil256(max(H, I, Hq*D)), plus 1 MiB; else 0.",
          note="q8_1 blocks, sized at 4 bytes per value plus slack", exact=False,
          families="every model, when the lever is on",
          empty="0 bytes and NULL unless METRALE_GGUF_NATIVE_Q2_MMQ is exactly \"1\".",
          accessors=("pointer", "bytes")),
    _spec("ssm_rowwise_w_bf16",
          "Slab for the BF16 copies of each GDN layer's in_proj_qkvz [QKVZ, H] and out_proj "
          "[H, Vd] weights under the row-wise FP8 prefill, made on the layer's first prefill and "
          "kept for the arena's life. It has no pointer accessor: carve it with "
          "arena.take_ssm_rowwise_w_bf16(bytes).",
          "bfloat16", "num_ssm_layers x ([QKVZ, H] + [H, Vd])",
          "num_ssm_layers*(2*QKVZ*H + 2*H*Vd) if fp8_rowwise else 0",
          "Lever on: num_ssm_layers x (BF16 [QKVZ, H] + BF16 [H, Vd]); else 0.",
          exact=False, families="GDN hybrids with row-wise FP8 weights",
          empty="0 bytes and NULL unless METRALE_FP8_ROWWISE is on (the variable is exactly "
                "\"1\", or absent with a row-wise FP8 quantization_config), and also when the "
                "model has no SSM layer or QKVZ and Vd are 0.",
          accessors=("bytes",)),
)
