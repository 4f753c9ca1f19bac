"""The QAT placement of nbqat written with torch.ao.quantization.FakeQuantize (test oracle and
benchmark reference): torch's default QAT fake-quant modules, a step-by-step LSTM with
fake-quantized input / weights / hidden state, and :func:`instrument`, which puts them into the
torch TFT of tests/ref_tft_torch.py at the places where nbqat's QAT model has its quantizers.
torch is passed in by the caller (never imported here).
"""

from __future__ import annotations

import types

import numpy as np

from nbqat.nn import LSTM, InterpretableMultiHeadAttention, Linear


def t_act(torch):
    q = torch.ao.quantization
    return q.FakeQuantize(
        observer=q.MovingAverageMinMaxObserver,
        quant_min=0,
        quant_max=255,
        dtype=torch.quint8,
        qscheme=torch.per_tensor_affine,
        reduce_range=False,
    )


def t_weight(torch):
    q = torch.ao.quantization
    return q.FakeQuantize(
        observer=q.MovingAveragePerChannelMinMaxObserver,
        quant_min=-128,
        quant_max=127,
        dtype=torch.qint8,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
    )


def torch_qlstm(torch, x, h, c, w_ih, w_hh, b_ih, b_hh, fq):
    """torch LSTM step loop with fake quantization at nbqat's places (gate order i, f, g, o)."""
    xq = fq["input"](x)
    wih, whh = fq["weight_ih"](w_ih), fq["weight_hh"](w_hh)
    d = h.shape[1]
    outs, hq0 = [], None
    for t in range(x.shape[1]):
        hq = fq["hidden"](h)
        hq0 = hq if hq0 is None else hq0
        a = xq[:, t] @ wih.T + (b_ih + b_hh) + hq @ whh.T
        i, f = torch.sigmoid(a[:, :d]), torch.sigmoid(a[:, d : 2 * d])
        g, o = torch.tanh(a[:, 2 * d : 3 * d]), torch.sigmoid(a[:, 3 * d :])
        c = f * c + i * g
        h = o * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs, 1), h, c, xq, hq0


def instrument(torch, tm, qat):
    """Put torch FakeQuantize modules into the torch TFT where ``qat`` has nbqat's; return
    ``{nbqat quantizer name: torch FakeQuantize}``."""
    F = torch.nn.functional
    tmods = dict(tm.named_modules())
    pairs = {}

    def linear_forward(self, x):
        return F.linear(self.fq_x(x), self.fq_w(self.weight), self.bias)

    def lstm_forward(self, x, state):
        h0, c0 = state
        out, h, c, _, _ = torch_qlstm(
            torch,
            x,
            h0[0],
            c0[0],
            self.weight_ih_l0,
            self.weight_hh_l0,
            self.bias_ih_l0,
            self.bias_hh_l0,
            self.fq,
        )
        return out, (h.unsqueeze(0), c.unsqueeze(0))

    def attn_forward(self, qin, kv, offset):
        b, tq, _ = qin.shape
        tk = kv.shape[1]
        q = self.q_proj(qin).view(b, tq, self.nh, self.dh).transpose(1, 2)
        k = self.k_proj(kv).view(b, tk, self.nh, self.dh).transpose(1, 2)
        v = self.v_proj(kv)
        s = q @ k.transpose(-1, -2) / float(np.sqrt(self.dh))
        i = torch.arange(tq).unsqueeze(1)
        j = torch.arange(tk).unsqueeze(0)
        p = torch.softmax(s.masked_fill(j > offset + i, float("-inf")), dim=-1)
        return self.out_proj((self.fq_p(p) @ v.unsqueeze(1)).mean(1))

    for name, mod in qat.model.named_modules():
        tmod = tmods.get(name)
        if tmod is None:  # parameter-free nbqat modules (ELU) are functions in torch
            continue
        if isinstance(mod, Linear) and mod.weight_fake_quant is not None:
            tmod.fq_w, tmod.fq_x = t_weight(torch), t_act(torch)
            tmod.forward = types.MethodType(linear_forward, tmod)
            pairs[name + ".weight_fake_quant"] = tmod.fq_w
            pairs[name + ".input_fake_quant"] = tmod.fq_x
        elif isinstance(mod, LSTM):
            tmod.fq = {
                "weight_ih": t_weight(torch),
                "weight_hh": t_weight(torch),
                "input": t_act(torch),
                "hidden": t_act(torch),
            }
            tmod.forward = types.MethodType(lstm_forward, tmod)
            for hk, f in tmod.fq.items():
                pairs[f"{name}.{hk}_fake_quant"] = f
        elif isinstance(mod, InterpretableMultiHeadAttention):
            tmod.fq_p = t_act(torch)
            tmod.forward = types.MethodType(attn_forward, tmod)
            pairs[name + ".attention_fake_quant"] = tmod.fq_p
    return pairs
