"""The model zoo's models (benchmarks/zoo.py): builders of tiny Hugging Face models from their
config classes (no weights) and of ``torch.nn`` models, each returning ``(model, example inputs,
loss function)`` with inputs sized so that activations, not parameters, make most of the peak."""

from __future__ import annotations

import torch
from torch import nn

# -- building blocks -------------------------------------------------------------------------------
def _hf_loss(output):
    return output.loss


def _ids(batch: int, tokens: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def _causal_lm(config_class, model_class=None, batch=4, tokens=64, vocab=128, **config):
    """A Hugging Face causal language model with ``labels`` (its loss inside the model)."""

    def build():
        import transformers

        torch.manual_seed(0)
        cls = model_class or transformers.AutoModelForCausalLM
        cfg = getattr(transformers, config_class)(vocab_size=vocab, **config)
        model = cls.from_config(cfg) if cls is transformers.AutoModelForCausalLM else cls(cfg)
        ids = _ids(batch, tokens, vocab)
        return model, {"input_ids": ids, "labels": ids}, _hf_loss

    return build


def _llama_like(config_class, **extra):
    config = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.1,
                  pad_token_id=0, bos_token_id=0, eos_token_id=0)
    config.update(extra)
    return _causal_lm(config_class, **config)


def _masked_lm(config_class, batch=4, tokens=64, vocab=128, **config):
    def build():
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_class)(vocab_size=vocab, **config)
        model = transformers.AutoModelForMaskedLM.from_config(cfg)
        ids = _ids(batch, tokens, vocab)
        return model, {"input_ids": ids, "labels": ids}, _hf_loss

    return build


_BERT_LIKE = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=128, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                  pad_token_id=0)


def _seq2seq(config_class, batch=4, tokens=48, vocab=128, **config):
    def build():
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_class)(vocab_size=vocab, **config)
        model = transformers.AutoModelForSeq2SeqLM.from_config(cfg)
        return model, {"input_ids": _ids(batch, tokens, vocab), "labels": _ids(batch, tokens, vocab, seed=2)}, _hf_loss

    return build


def _image_classifier(config_class, batch=4, image=32, channels=3, labels=10, model_class=None, **config):
    def build():
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_class)(num_labels=labels, **config)
        if model_class:  # the auto class maps some configs to several classes (DeiT: with a teacher or not)
            model = getattr(transformers, model_class)(cfg)
        else:
            model = transformers.AutoModelForImageClassification.from_config(cfg)
        pixels = torch.randn(batch, channels, image, image, generator=torch.Generator().manual_seed(1))
        targets = torch.randint(0, labels, (batch,), generator=torch.Generator().manual_seed(2))
        return model, {"pixel_values": pixels, "labels": targets}, _hf_loss

    return build


def _whisper():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        vocab_size=128, num_mel_bins=16, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, d_model=32,
        max_source_positions=64, max_target_positions=64, dropout=0.1, attention_dropout=0.1,
        pad_token_id=0, bos_token_id=0, eos_token_id=0, decoder_start_token_id=0,
    )
    model = transformers.WhisperForConditionalGeneration(cfg)
    features = torch.randn(4, 16, 128, generator=torch.Generator().manual_seed(1))  # 2 x max_source_positions frames
    return model, {"input_features": features, "labels": _ids(4, 32, 128, seed=2)}, _hf_loss


def _clip():
    import transformers

    torch.manual_seed(0)
    text = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                max_position_embeddings=64, dropout=0.1, attention_dropout=0.1)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, image_size=32,
                  patch_size=4, dropout=0.1, attention_dropout=0.1)
    model = transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32))
    inputs = {"input_ids": _ids(8, 32, 128), "pixel_values": torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1)),
              "return_loss": True}
    return model, inputs, _hf_loss


# -- torch.nn models ---------------------------------------------------------------------------------
def _mse(output):
    return output.float().pow(2).mean()


class RecurrentLM(nn.Module):
    """Embedding, a stacked recurrent network with dropout between its layers, a dropout, a head."""

    def __init__(self, cell, vocab: int = 64, width: int = 32, hidden: int = 64, layers: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = cell(width, hidden, num_layers=layers, batch_first=True, dropout=0.1)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        return self.head(self.drop(self.rnn(self.embed(ids))[0]))


def _recurrent(cell):
    def build():
        torch.manual_seed(0)
        return RecurrentLM(cell), (_ids(8, 32, 64),), _mse

    return build


def _transformer_encoder(causal: bool):
    def build():
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        x = torch.randn(8, 32, 32, generator=torch.Generator().manual_seed(1))
        if causal:  # a mask without is_causal: torch tests it for causality (profiler/transformer.py)
            return model, {"src": x, "mask": nn.Transformer.generate_square_subsequent_mask(32)}, _mse
        return model, (x,), _mse

    return build


class TorchViT(nn.Module):
    """A ViT on nn.TransformerEncoder (batch_first, pre-norm): patches, a class token, a head."""

    def __init__(self, image: int = 32, patch: int = 4, width: int = 32, layers: int = 4, classes: int = 10):
        super().__init__()
        self.patches = nn.Conv2d(3, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.position = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, width) * 0.02)
        self.drop = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True, norm_first=True,
                                           activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, images, labels):
        x = self.patches(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.encoder(self.drop(x + self.position))
        return nn.functional.cross_entropy(self.head(self.norm(x[:, 0])), labels)


def _torch_vit():
    torch.manual_seed(0)
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(2))
    return TorchViT(), (images, labels), lambda loss: loss


class UNet(nn.Module):
    """Two levels down, two up, skip connections, BatchNorm, a dropout at the bottom."""

    def __init__(self, channels: int = 8):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

        c = channels
        self.down1, self.down2, self.bottom = block(3, c), block(c, 2 * c), block(2 * c, 4 * c)
        self.drop = nn.Dropout2d(0.1)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2), block(4 * c, 2 * c)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * c, c, 2, stride=2), block(2 * c, c)
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(nn.functional.max_pool2d(d1, 2))
        b = self.drop(self.bottom(nn.functional.max_pool2d(d2, 2)))
        u2 = self.dec2(torch.cat([self.up2(b), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return self.out(u1)


def _unet():
    torch.manual_seed(0)
    return UNet(), (torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1)),), _mse


class MoE(nn.Module):
    """A mixture of experts with top-k routing, computed densely (every expert on every token,
    weighted by the renormalised top-k gates, zero elsewhere): traceable, no data-dependent shapes."""

    def __init__(self, width: int = 32, experts: int = 4, k: int = 2, hidden: int = 64):
        super().__init__()
        self.k = k
        self.gate = nn.Linear(width, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Dropout(0.1),
                                                   nn.Linear(hidden, width)) for _ in range(experts))

    def forward(self, x):
        scores = self.gate(x).softmax(-1)
        top, index = scores.topk(self.k, dim=-1)
        weights = torch.zeros_like(scores).scatter(-1, index, top / top.sum(-1, keepdim=True))
        return x + sum(weights[..., e : e + 1] * expert(x) for e, expert in enumerate(self.experts))


class MoEModel(nn.Module):
    moe: type = MoE  # the mixture each layer holds after its norm

    def __init__(self, layers: int = 3, width: int = 32):
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), self.moe(width)) for _ in range(layers))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _moe():
    torch.manual_seed(0)
    return MoEModel(), (torch.randn(8, 64, 16, generator=torch.Generator().manual_seed(1)),), _mse


class SparseMoE(MoE):
    """A mixture of experts with top-k routing as MoE layers run it: each expert computes only the
    tokens routed to it (gathered by their indices, its weighted output added back by index), and an
    expert no token chose is skipped. Shapes depend on the routing (``nonzero``) and so does the
    control flow: the tracer cannot follow it (the plan is made from an eager step). The same
    parameters as :class:`MoE`."""

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        top, index = self.gate(flat).softmax(-1).topk(self.k, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (index == e).nonzero(as_tuple=True)
            if rows.numel() == 0:  # no token chose this expert
                continue
            out = out.index_add(0, rows, top[rows, slot].unsqueeze(-1) * expert(flat[rows]))
        return x + out.reshape(x.shape)


class SparseMoEModel(MoEModel):
    moe = SparseMoE


def _sparse_moe():
    torch.manual_seed(0)
    return SparseMoEModel(), (torch.randn(8, 64, 16, generator=torch.Generator().manual_seed(1)),), _mse


class ControlFlowBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up, self.drop, self.down = nn.Linear(width, 4 * width), nn.Dropout(0.1), nn.Linear(4 * width, width)

    def forward(self, x):
        h = self.down(self.drop(torch.tanh(self.up(x))))
        if h.mean() > 0:  # Python control flow on a tensor's value: the tracer cannot follow it
            h = h * 2
        return x + h


class ControlFlowModel(nn.Module):
    def __init__(self, width: int = 64, blocks: int = 8):
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.blocks = nn.ModuleList(ControlFlowBlock(width) for _ in range(blocks))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _control_flow():
    torch.manual_seed(0)
    return ControlFlowModel(), (torch.randn(256, 64, generator=torch.Generator().manual_seed(1)),), _mse
