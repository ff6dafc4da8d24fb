"""Tiny models written the way popular model libraries write them.

Shared by the torch.compiler.precompile tests (test_precompile_zoo.py,
test_precompile_fuzz.py, test_precompile_concurrency.py).  Every model is
deliberately tiny (hidden sizes 8-16, sequences 4-8, batches 2-4) because an
Inductor compile costs seconds per artifact on a 2-core CI machine.

Each zoo entry is a ``ZooCase``: a model factory, an input factory, an
inference function ``infer(model, *inputs)`` and a training step
``train(model, *inputs)`` that runs ``loss.backward()`` and returns the loss.
"""

import copy
import dataclasses
import math
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------
# Decoder-only transformer LM (HF GPT-2 / LLaMA style)
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class TinyConfig:
    vocab_size: int = 32
    hidden_size: int = 16
    num_heads: int = 2
    num_layers: int = 2
    max_positions: int = 8
    intermediate_size: int = 32
    num_labels: int = 3
    layer_norm_eps: float = 1e-5
    dropout: float = 0.0


class NewGELUActivation(nn.Module):
    """GPT-2's tanh GELU, written out like transformers.activations does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def make_causal_mask(batch: int, seq_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """transformers' ``_make_causal_mask``: an additive mask of 0 / finfo(dtype).min."""
    mask = torch.full((seq_len, seq_len), torch.finfo(dtype).min, device=device)
    mask_cond = torch.arange(mask.size(-1), device=device)
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    mask = mask.to(dtype)
    return mask[None, None, :, :].expand(batch, 1, seq_len, seq_len)


class GPTAttention(nn.Module):
    def __init__(self, config: TinyConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.c_attn = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.c_proj = nn.Linear(config.hidden_size, config.hidden_size)
        # GPT-2 keeps its causal pattern as a non-persistent bool buffer.
        self.register_buffer(
            "bias",
            torch.tril(torch.ones((config.max_positions, config.max_positions), dtype=torch.bool)).view(
                1, 1, config.max_positions, config.max_positions
            ),
            persistent=False,
        )

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.size()
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        b, t, c = hidden_states.size()
        query, key, value = self.c_attn(hidden_states).split(c, dim=2)
        query, key, value = self._split_heads(query), self._split_heads(key), self._split_heads(value)
        # GPT-2's eager path: where(causal, scores, finfo.min) with the
        # minimum as a tensor literal, then an additive mask on top.
        scores = torch.matmul(query, key.transpose(-1, -2)) / torch.full(
            [], value.size(-1) ** 0.5, dtype=query.dtype, device=query.device
        )
        causal = self.bias[:, :, :t, :t]
        mask_value = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype, device=scores.device)
        scores = torch.where(causal, scores, mask_value)
        scores = scores + attention_mask
        probs = nn.functional.softmax(scores, dim=-1)
        eager_out = torch.matmul(probs, value)
        # ... and the SDPA path, with the same additive mask.
        sdpa_out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask)
        out = 0.5 * (eager_out + sdpa_out)
        out = out.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(out)


class GPTMLP(nn.Module):
    def __init__(self, config: TinyConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.hidden_size, config.intermediate_size)
        self.c_proj = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = NewGELUActivation()
        self.act2 = nn.GELU()
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        h = 0.5 * (self.act(h) + self.act2(h))
        return self.dropout(self.c_proj(h))


class GPTBlock(nn.Module):
    def __init__(self, config: TinyConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = GPTAttention(config)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = GPTMLP(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states), attention_mask)
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class TinyGPTLMHeadModel(nn.Module):
    """Decoder-only LM with a tied embedding / LM head (GPT2LMHeadModel-like)."""

    def __init__(self, config: TinyConfig | None = None):
        super().__init__()
        config = config or TinyConfig()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_positions, config.hidden_size)
        self.h = nn.ModuleList([GPTBlock(config) for _ in range(config.num_layers)])
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tie_weights()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        b, t = input_ids.shape
        position_ids = torch.arange(0, t, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        hidden_states = self.wte(input_ids) + self.wpe(position_ids)
        dtype = hidden_states.dtype
        attention_mask = make_causal_mask(b, t, dtype, input_ids.device)
        for block in self.h:
            hidden_states = block(hidden_states, attention_mask)
        logits = self.lm_head(self.ln_f(hidden_states))
        output = {"logits": logits}
        if labels is not None:
            shift_logits = logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            output["loss"] = F.cross_entropy(
                shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1)
            )
        return output


# ---------------------------------------------------------------------------
# Encoder classifier with an attention-mask input (HF BERT style)
# ---------------------------------------------------------------------------


class BertSelfAttention(nn.Module):
    def __init__(self, config: TinyConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.output = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def transpose_for_scores(self, x: torch.Tensor) -> torch.Tensor:
        new_shape = x.size()[:-1] + (self.num_heads, self.head_dim)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states: torch.Tensor, extended_mask: torch.Tensor) -> torch.Tensor:
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.transpose_for_scores(self.key(hidden_states))
        v = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores + extended_mask
        probs = nn.functional.softmax(scores, dim=-1)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        context = context.view(context.size()[:-2] + (self.num_heads * self.head_dim,))
        return self.LayerNorm(self.output(context) + hidden_states)


class BertLayer(nn.Module):
    def __init__(self, config: TinyConfig):
        super().__init__()
        self.attention = BertSelfAttention(config)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, extended_mask: torch.Tensor) -> torch.Tensor:
        attn = self.attention(hidden_states, extended_mask)
        h = F.gelu(self.intermediate(attn))
        return self.LayerNorm(self.output(h) + attn)


class TinyBertForSequenceClassification(nn.Module):
    def __init__(self, config: TinyConfig | None = None):
        super().__init__()
        config = config or TinyConfig(num_layers=1)
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(config.max_positions, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(2, config.hidden_size)
        self.embeddings_LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.register_buffer(
            "position_ids", torch.arange(config.max_positions).expand((1, -1)), persistent=False
        )
        self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_layers)])
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def get_extended_attention_mask(self, attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        extended = attention_mask[:, None, None, :].to(dtype=dtype)
        return (1.0 - extended) * torch.finfo(dtype).min

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        t = input_ids.size(1)
        token_type_ids = torch.zeros_like(input_ids)
        h = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(self.position_ids[:, :t])
            + self.token_type_embeddings(token_type_ids)
        )
        h = self.embeddings_LayerNorm(h)
        extended = self.get_extended_attention_mask(attention_mask, h.dtype)
        for layer in self.layer:
            h = layer(h, extended)
        pooled = torch.tanh(self.pooler(h[:, 0]))
        return self.classifier(pooled)


# ---------------------------------------------------------------------------
# ResNet-style conv / BatchNorm / residual net (torchvision style)
# ---------------------------------------------------------------------------


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class TinyResNet(nn.Module):
    def __init__(self, num_classes: int = 4, width: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(
            width,
            2 * width,
            stride=2,
            downsample=nn.Sequential(
                nn.Conv2d(width, 2 * width, kernel_size=1, stride=2, bias=False), nn.BatchNorm2d(2 * width)
            ),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# ---------------------------------------------------------------------------
# Recurrent sequence models
# ---------------------------------------------------------------------------


class TinyLSTMTagger(nn.Module):
    def __init__(self, vocab: int = 16, hidden: int = 8, tags: int = 4):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=1, batch_first=True)
        self.head = nn.Linear(hidden, tags)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, (h, c) = self.lstm(self.embedding(tokens))
        return self.head(out) + h[-1][:, None, :].sum(-1, keepdim=True)


class TinyGRUClassifier(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 8, classes: int = 3):
        super().__init__()
        self.gru = nn.GRU(features, hidden, num_layers=1, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, h = self.gru(x)
        return self.head(out[:, -1])


# ---------------------------------------------------------------------------
# EmbeddingBag / gather-scatter (DLRM / torchrec style)
# ---------------------------------------------------------------------------


class TinyBagModel(nn.Module):
    def __init__(self, num_embeddings: int = 20, dim: int = 8, classes: int = 3):
        super().__init__()
        self.bag_sum = nn.EmbeddingBag(num_embeddings, dim, mode="sum")
        self.bag_mean = nn.EmbeddingBag(num_embeddings, dim, mode="mean")
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
        pooled = self.bag_sum(indices, offsets) + self.bag_mean(indices, offsets)  # (bags, dim)
        h = torch.relu(self.proj(pooled))
        # Gather each bag's best feature, then scatter-add bags into segments.
        top = torch.gather(h, 1, h.argmax(dim=1, keepdim=True))
        segments = torch.zeros(2, h.size(1), dtype=h.dtype, device=h.device)
        segments = segments.scatter_add(0, segment[:, None].expand_as(h), h * top)
        return self.head(segments[segment] + h)


# ---------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------


class TinyDropoutMLP(nn.Module):
    def __init__(self, features: int = 16, hidden: int = 16, classes: int = 4, p: float = 0.25):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.drop1 = nn.Dropout(p)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop1(torch.relu(self.fc1(x)))
        h = F.dropout(torch.relu(self.fc2(h)), p=0.5, training=self.training)
        return self.fc3(h)


# ---------------------------------------------------------------------------
# Zoo table
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class ZooCase:
    name: str
    make_model: Callable[[], nn.Module]
    make_inputs: Callable[..., tuple]  # make_inputs(seed=0)
    infer: Callable[..., Any]
    train: Callable[..., Any]
    # Whether the model stays in train mode for inference (dropout / BN stats).
    infer_train_mode: bool = False
    seeded: bool = False  # results depend on torch's RNG (compare under manual_seed)


def _gpt_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(1 + 100 * seed)
    ids = torch.randint(0, 32, (2, 8), generator=g)
    return ids, ids.clone()


def _gpt_infer(model, input_ids, labels):
    return model(input_ids)["logits"]


def _gpt_train(model, input_ids, labels):
    out = model(input_ids, labels=labels)
    out["loss"].backward()
    return out["loss"].detach(), out["logits"].detach()


def _bert_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(2 + 100 * seed)
    ids = torch.randint(1, 32, (2, 6), generator=g)
    lengths = [(6, 4), (3, 6)][seed % 2]
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in lengths])
    ids = ids * mask  # padding_idx 0 where masked
    labels = torch.randint(0, 3, (2,), generator=g)
    return ids, mask, labels


def _bert_infer(model, ids, mask, labels):
    return model(ids, mask)


def _bert_train(model, ids, mask, labels):
    logits = model(ids, mask)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    return loss


def _resnet_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(3 + 100 * seed)
    return torch.randn(2, 3, 8, 8, generator=g), torch.randint(0, 4, (2,), generator=g)


def _resnet_infer(model, x, y):
    return model(x)


def _resnet_train(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss


def _lstm_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(4 + 100 * seed)
    return torch.randint(0, 16, (2, 5), generator=g), torch.randint(0, 4, (2, 5), generator=g)


def _lstm_infer(model, tokens, tags):
    return model(tokens)


def _lstm_train(model, tokens, tags):
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tags.reshape(-1))
    loss.backward()
    return loss


def _gru_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(5 + 100 * seed)
    return torch.randn(3, 4, 8, generator=g), torch.randint(0, 3, (3,), generator=g)


def _gru_infer(model, x, y):
    return model(x)


def _gru_train(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss


def _bag_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(7 + 100 * seed)
    indices = torch.randint(0, 20, (10,), generator=g)
    offsets = torch.tensor([0, 3, 5, 8])
    segment = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]][seed % 2])
    labels = torch.randint(0, 3, (4,), generator=g)
    return indices, offsets, segment, labels


def _bag_infer(model, indices, offsets, segment, labels):
    return model(indices, offsets, segment)


def _bag_train(model, indices, offsets, segment, labels):
    loss = F.cross_entropy(model(indices, offsets, segment), labels)
    loss.backward()
    return loss


def _dropout_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(6 + 100 * seed)
    return torch.randn(4, 16, generator=g), torch.randint(0, 4, (4,), generator=g)


def _dropout_infer(model, x, y):
    return model(x)


def _dropout_train(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss


def _seeded(factory: Callable[[], nn.Module], seed: int) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        torch.manual_seed(seed)
        return factory()

    return make


ZOO = {
    case.name: case
    for case in [
        ZooCase("gpt", _seeded(TinyGPTLMHeadModel, 10), _gpt_inputs, _gpt_infer, _gpt_train),
        ZooCase("bert", _seeded(TinyBertForSequenceClassification, 11), _bert_inputs, _bert_infer, _bert_train),
        ZooCase("resnet", _seeded(TinyResNet, 12), _resnet_inputs, _resnet_infer, _resnet_train),
        ZooCase("lstm", _seeded(TinyLSTMTagger, 13), _lstm_inputs, _lstm_infer, _lstm_train),
        ZooCase("gru", _seeded(TinyGRUClassifier, 14), _gru_inputs, _gru_infer, _gru_train),
        ZooCase("bag", _seeded(TinyBagModel, 15), _bag_inputs, _bag_infer, _bag_train),
        ZooCase(
            "dropout",
            _seeded(TinyDropoutMLP, 16),
            _dropout_inputs,
            _dropout_infer,
            _dropout_train,
            infer_train_mode=True,
            seeded=True,
        ),
    ]
}


def clone_model(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


# ---------------------------------------------------------------------------
# Small helpers shared by fuzz / concurrency tests
# ---------------------------------------------------------------------------


class TinyMLP(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, out: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))
