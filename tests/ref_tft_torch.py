"""The TFT-like network of nbqat.nn written independently in PyTorch (test oracle and benchmark
reference). Built through :func:`make_torch_tft` so that torch is only imported by the caller
(the ``torch`` fixture, or the benchmark). Parameter names equal nbqat's ``named_parameters()``
except the LSTMs, which are ``torch.nn.LSTM`` (``weight_ih`` -> ``weight_ih_l0`` etc.).
"""

from __future__ import annotations

import math

import numpy as np


def torch_name(nbqat_name: str) -> str:
    """nbqat parameter name -> the torch reference's name."""
    if nbqat_name.startswith("lstm_"):
        return nbqat_name + "_l0"
    return nbqat_name


def make_torch_tft(torch, cfg, state_dict=None, dtype=None):
    """Build the torch TFT for ``cfg`` (a TFTConfig); copy nbqat's ``state_dict`` in if given."""
    nn = torch.nn
    F = torch.nn.functional

    class GLU(nn.Module):
        def __init__(self, i, o):
            super().__init__()
            self.fc = nn.Linear(i, 2 * o)
            self.mask = None  # a fixed dropout mask (already scaled by 1 / (1 - p))

        def forward(self, x):
            if self.mask is not None:
                x = x * self.mask.reshape(x.shape)  # nbqat may run rows (B * L, d)
            return F.glu(self.fc(x), dim=-1)  # first half * sigmoid(second half)

    class GateAddNorm(nn.Module):
        def __init__(self, i, o):
            super().__init__()
            self.glu = GLU(i, o)
            self.norm = nn.LayerNorm(o)

        def forward(self, x, skip):
            return self.norm(self.glu(x) + skip)

    class GRN(nn.Module):
        def __init__(self, i, h, o, c=None):
            super().__init__()
            self.fc1 = nn.Linear(i, h)
            self.context = nn.Linear(c, h, bias=False) if c is not None else None
            self.fc2 = nn.Linear(h, h)
            self.gate = GateAddNorm(h, o)
            self.skip = nn.Linear(i, o) if i != o else None

        def forward(self, a, c=None):
            z = self.fc1(a)
            if c is not None:
                cp = self.context(c)
                z = z + (cp.unsqueeze(1) if a.dim() == 3 else cp)
            eta1 = self.fc2(F.elu(z))
            skip = self.skip(a) if self.skip is not None else a
            return self.gate(eta1, skip)

    class Embedding(nn.Module):
        def __init__(self, m, d):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(m, d))
            self.bias = nn.Parameter(torch.zeros(m, d))

        def forward(self, x):
            return x.unsqueeze(-1) * self.weight + self.bias  # (..., m, d)

    class VSN(nn.Module):
        def __init__(self, m, d, c=None):
            super().__init__()
            self.embedding = Embedding(m, d)
            self.flat_grn = GRN(m * d, d, m, c)
            self.var_grns = nn.ModuleList([GRN(d, d, d) for _ in range(m)])

        def forward(self, x, c=None):
            e = self.embedding(x)
            w = torch.softmax(self.flat_grn(e.flatten(-2), c), dim=-1)
            xs = torch.stack([g(e[..., j, :]) for j, g in enumerate(self.var_grns)], dim=-2)
            return (w.unsqueeze(-1) * xs).sum(-2), w

    class IMHA(nn.Module):
        def __init__(self, d, nh):
            super().__init__()
            self.nh, self.dh = nh, d // nh
            self.q_proj = nn.Linear(d, d)
            self.k_proj = nn.Linear(d, d)
            self.v_proj = nn.Linear(d, self.dh)
            self.out_proj = nn.Linear(self.dh, d)

        def forward(self, qin, kv, offset):
            b, tq, _ = qin.shape
            tk = kv.shape[1]
            q = self.q_proj(qin).view(b, tq, self.nh, self.dh).transpose(1, 2)  # (B, H, tq, dh)
            k = self.k_proj(kv).view(b, tk, self.nh, self.dh).transpose(1, 2)  # (B, H, T, dh)
            v = self.v_proj(kv)  # (B, T, dh)
            s = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
            i = torch.arange(tq).unsqueeze(1)
            j = torch.arange(tk).unsqueeze(0)
            s = s.masked_fill(j > offset + i, float("-inf"))  # a step sees itself
            p = torch.softmax(s, dim=-1)
            self.p = p
            return self.out_proj((p @ v.unsqueeze(1)).mean(1))

    class TFT(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            d = cfg.hidden_dim
            self.k = cfg.sequence_length
            self.cfg = cfg
            self.static_vsn = VSN(cfg.num_static_features, d)
            self.static_context_variable_selection = GRN(d, d, d)
            self.static_context_enrichment = GRN(d, d, d)
            self.static_context_initial_hidden = GRN(d, d, d)
            self.static_context_initial_cell = GRN(d, d, d)
            self.encoder_vsn = VSN(cfg.num_unknown_features, d, d)
            self.decoder_vsn = VSN(cfg.num_known_features, d, d)
            self.lstm_encoder = nn.LSTM(d, d, batch_first=True)
            self.lstm_decoder = nn.LSTM(d, d, batch_first=True)
            self.post_lstm_gate = GateAddNorm(d, d)
            self.static_enrichment = GRN(d, d, d, d)
            self.multihead_attn = IMHA(d, cfg.num_heads)
            self.post_attn_gate = GateAddNorm(d, d)
            self.pos_wise_ff = GRN(d, d, d)
            self.pre_output_gate = GateAddNorm(d, d)
            self.output_layer = nn.Linear(d, cfg.num_quantiles)
            self.tau, self.nq = cfg.prediction_horizon, cfg.num_quantiles
            self.linear_skip = None
            if getattr(cfg, "linear_skip", False):  # TiDE / DLinear-style skip of the window
                self.linear_skip = nn.Linear(cfg.window_features, self.tau * self.nq)

        def forward(self, static, hist, fut):
            k = self.k
            xi_s, _ = self.static_vsn(static)
            c_s = self.static_context_variable_selection(xi_s)
            c_e = self.static_context_enrichment(xi_s)
            c_h = self.static_context_initial_hidden(xi_s)
            c_c = self.static_context_initial_cell(xi_s)
            skip_hist = hist  # the skip reads the last k_s steps, the body the last k
            if getattr(self.cfg, "skip_sequence_length", None) is not None:
                skip_hist = hist[:, hist.shape[1] - self.cfg.skip_sequence_length :]
            hist = hist[:, hist.shape[1] - k :]
            e_enc, _ = self.encoder_vsn(hist, c_s)
            e_dec, _ = self.decoder_vsn(fut, c_s)
            h_enc, (hk, ck) = self.lstm_encoder(e_enc, (c_h.unsqueeze(0), c_c.unsqueeze(0)))
            h_dec, _ = self.lstm_decoder(e_dec, (hk, ck))
            phi = self.post_lstm_gate(torch.cat([h_enc, h_dec], 1), torch.cat([e_enc, e_dec], 1))
            theta = self.static_enrichment(phi, c_e)
            attn = self.multihead_attn(theta[:, k:], theta, k)
            delta = self.post_attn_gate(attn, theta[:, k:])
            psi = self.pos_wise_ff(delta)
            out = self.output_layer(self.pre_output_gate(psi, phi[:, k:]))
            if self.linear_skip is not None:
                b = static.shape[0]
                x = torch.cat([skip_hist.reshape(b, -1), fut.reshape(b, -1), static], dim=1)
                out = out + self.linear_skip(x).reshape(b, self.tau, self.nq)
            return out

    model = TFT(cfg)
    if dtype is not None:
        model = model.to(dtype)
    if state_dict is not None:
        own = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in state_dict.items():
                p = own.pop(torch_name(name))
                p.copy_(torch.from_numpy(np.ascontiguousarray(value)).to(p.dtype))
        assert not own, f"torch parameters not set: {sorted(own)}"
    return model
