from __future__ import annotations

import torch

from opensearch_lsr.training.fused_splade import find_splade_pairs, fused_splade, splade_max_pool


def _no_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def _forward_backward(model, feats):
    model.zero_grad()
    emb = model(dict(feats))["sentence_embedding"]
    weights = torch.linspace(0.1, 1.0, emb.shape[1])
    (emb * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return emb.detach(), grads


def test_fused_equals_stock_forward_and_gradients(tiny_encoder_dir):
    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    model = load_sparse_encoder(str(tiny_encoder_dir))
    model.train()
    _no_dropout(model)
    with torch.no_grad():  # a non-trivial decoder bias so some maxima are <= 0 (relu-dead)
        model[0].auto_model.get_output_embeddings().bias.normal_(0, 1.0)
    feats = model.preprocess(["the cat is of the house", "seoul korea", "a"])
    stock_emb, stock_grads = _forward_backward(model, feats)
    with fused_splade(model) as patched:
        assert patched == 1
        fused_emb, fused_grads = _forward_backward(model, feats)
    assert torch.allclose(stock_emb, fused_emb, atol=1e-6)
    assert (stock_emb == 0).any() and (stock_emb > 0).any()
    assert stock_grads.keys() == fused_grads.keys()
    for name in stock_grads:
        assert torch.allclose(stock_grads[name], fused_grads[name], atol=1e-5, rtol=1e-4), name
    # restored: the stock path runs again and the decoder is back in place
    again, _ = _forward_backward(model, feats)
    assert torch.equal(again, stock_emb)
    assert "forward" not in vars(model[0]) and "forward" not in vars(model[1])


def test_splade_max_pool_masks_padding_and_double_log():
    torch.manual_seed(0)
    hidden = torch.randn(2, 4, 3)
    weight = torch.randn(5, 3)
    bias = torch.randn(5)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    logits = hidden @ weight.T + bias
    expected = torch.log1p(torch.relu((logits * mask[..., None]).relu().amax(dim=1)))
    assert torch.allclose(splade_max_pool(hidden, mask, weight, bias), expected, atol=1e-6)
    assert torch.allclose(splade_max_pool(hidden, mask, weight, bias, "log1p_relu"), torch.log1p(expected), atol=1e-6)


def test_router_pairs_found(tiny_encoder_dir, tmp_path):
    from opensearch_lsr.inference_free import build_inference_free

    model = build_inference_free(tiny_encoder_dir, tmp_path / "if", idf_corpus=["the cat", "seoul korea"])
    assert len(find_splade_pairs(model)) == 1
