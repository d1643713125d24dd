import re
from collections import Counter


def tokens(text):
    return re.findall(r"\w+", (text or "").lower())


def f1(prediction, target):
    pred = tokens(prediction)
    gold = tokens(target)
    if not pred and not gold:
        return 1.0
    if not pred or not gold:
        return 0.0

    overlap = Counter(pred) & Counter(gold)
    common = sum(overlap.values())
    if common == 0:
        return 0.0

    precision = common / len(pred)
    recall = common / len(gold)
    return 2 * precision * recall / (precision + recall)


def grade(sample, item):
    return {"scores": {"token_f1": f1(sample.get("output_text", ""), item.get("target", ""))}}
