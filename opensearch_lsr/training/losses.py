"""Two training terms sentence-transformers does not ship: InfoNCE plus a KL term, and an IDF-aware FLOPS.

* :class:`InfoNCEWithKL`: in-batch InfoNCE (``SparseMultipleNegativesRankingLoss``) plus ``kl_weight`` x the
  KL divergence between the teacher's and the student's score distributions over each row's candidates
  (``SparseDistillKLDivLoss``), the combination SPLADE++ found best on hard negatives (Formal et al. 2022,
  "From Distillation to Hard Negative Sampling"). Both parts read the same embeddings, so a step costs no
  more than either loss alone; the teacher scores must sit at the student's scale (``training.teacher``).
* :class:`IdfFlopsLoss`: the FLOPS regulariser (Paria et al. 2020) with each vocabulary dimension's term
  weighted by ``1 / idf`` (normalised to mean 1 over the vocabulary), the IDF-aware penalty of OpenSearch's
  inference-free models (Geng et al. 2024, "Towards Competitive Search Relevance For Inference-Free Learned
  Sparse Retrievers", sec. 3.2): a document token's score is ``idf * w``, so a frequent token (low IDF)
  buys little relevance for the same posting-list cost and is pushed down harder than a rare one.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

__all__ = ["InfoNCEWithKL", "IdfFlopsLoss", "idf_penalty_weights"]


class InfoNCEWithKL(nn.Module):
    """``InfoNCE + kl_weight * KL(teacher || student)``; rows need teacher ``scores`` ([pos, negs...])."""

    def __init__(self, model, kl_weight: float, kl_temperature: float = 1.0) -> None:
        from sentence_transformers.sparse_encoder import losses

        super().__init__()
        if not kl_weight > 0:
            raise ValueError(f"kl_weight must be > 0, got {kl_weight}")
        self.model = model
        self.kl_weight = float(kl_weight)
        self.infonce = losses.SparseMultipleNegativesRankingLoss(model)
        self.kl = losses.SparseDistillKLDivLoss(model, temperature=kl_temperature)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor) -> Tensor:
        return (self.infonce.compute_loss_from_embeddings(embeddings, labels)
                + self.kl_weight * self.kl.compute_loss_from_embeddings(embeddings, labels))

    def forward(self, sentence_features, labels: Tensor) -> Tensor:  # pragma: no cover - SpladeLoss calls the above
        raise NotImplementedError("InfoNCEWithKL is used inside SpladeLoss")

    def get_config_dict(self) -> dict:
        return {"kl_weight": self.kl_weight, "kl_temperature": self.kl.temperature}


def idf_penalty_weights(idf: Mapping[str, float], vocab: Mapping[str, int], size: int,
                        floor: float = 0.1) -> Tensor:
    """Per-dimension FLOPS weights ``1 / max(idf, floor)``, normalised to mean 1 over the ``size`` dimensions.

    A token missing from ``idf`` counts as IDF 1.0, as ML Commons reads a missing ``idf.json`` key.
    """
    raw = torch.ones(size, dtype=torch.float32)
    for token, value in idf.items():
        index = vocab.get(token)
        if index is not None and index < size:
            raw[index] = 1.0 / max(float(value), floor)
    return raw / raw.mean()


class IdfFlopsLoss(nn.Module):
    """``sum_j p_j * (mean_i w_ij)^2`` with ``p = idf_penalty_weights``: FLOPS weighted per dimension."""

    def __init__(self, model, penalty: Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("penalty", penalty.float(), persistent=False)

    def compute_loss_from_embeddings(self, embeddings: Tensor) -> Tensor:
        penalty = self.penalty.to(embeddings.device, embeddings.dtype)
        return torch.sum(penalty * torch.mean(embeddings, dim=0) ** 2)

    def forward(self, sentence_features, labels: Tensor) -> Tensor:  # pragma: no cover - SpladeLoss calls the above
        raise NotImplementedError("IdfFlopsLoss is used inside SpladeLoss as the document regulariser")

    def get_config_dict(self) -> dict:
        return {"idf_aware": True}
