import math


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return 0.0 if na == 0 or nb == 0 else dot / (na * nb)


def grade(sample, item, ctx):
    result = ctx.embeddings_create(
        model="auto",  # the run's embeddingModel
        input=[sample.get("output_text", ""), item.get("target", "")],
    )

    output_embedding = result["data"][0]["embedding"]
    target_embedding = result["data"][1]["embedding"]
    score = cosine(output_embedding, target_embedding)

    return {
        "scores": {"semantic_similarity": score},
        "judge": {"embedding_model": result.get("model")},
    }
