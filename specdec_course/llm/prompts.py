"""The real model's three prompt sets: input-grounded, open chat, code writing.

None of them is in the draft's training prompts (``llm.distill`` draws from other topics and
tasks), so the trained draft is measured on text it never saw. The grounded prompts give
the model a passage or a program and ask for a summary, a quotation or an edit: the answer
repeats long spans of its input, the case prompt lookup is for.
"""

from __future__ import annotations

__all__ = ["PROMPT_SETS"]

_LIGHTHOUSE = (
    "The lighthouse on Gull Point was built in 1871 to guide fishing boats past the reef. "
    "Its first keeper, Martha Hale, kept the lamp burning through the great storm of 1883, "
    "when waves broke over the gallery forty feet above the sea. The light was automated in "
    "1962, and the keeper's cottage became a small museum. Today volunteers repaint the tower "
    "every five years, and the museum shows Martha Hale's logbook, her brass telescope and a "
    "model of the reef."
)
_BAKERY = (
    "Our bakery opens at seven in the morning from Tuesday to Sunday and closes on Mondays. "
    "Bread is baked fresh every morning, and the sourdough is ready at nine. Cakes must be "
    "ordered at least two days in advance, by phone or in the shop. We accept cash and cards, "
    "but not cheques. Parking is free behind the building for the first hour."
)
_CODE = """def average(values):
    total = 0
    for v in values:
        total = total + v
    return total / len(values)


def largest(values):
    best = values[0]
    for v in values:
        if v > best:
            best = v
    return best
"""

PROMPT_SETS = {
    "grounded": [
        f"Repeat the following passage word for word, then give it a title.\n\n{_LIGHTHOUSE}",
        f"Summarise this passage in three sentences, quoting its dates exactly.\n\n{_LIGHTHOUSE}",
        "Rewrite this notice so that it is addressed to children, keeping every fact.\n\n"
        + _BAKERY,
        "Copy this notice and then list its rules as bullet points.\n\n" + _BAKERY,
        "Add a docstring to each function in this Python code and return the whole code.\n\n"
        + _CODE,
        "Rename the variable `values` to `numbers` in this code and return the full code.\n\n"
        + _CODE,
    ],
    "chat": [
        "What are some good ways to stay focused while studying?",
        "Tell me how an ant colony is organised.",
        "What would I see on a trip to Antarctica?",
        "Give me advice for my first day at a new job.",
        "Why do leaves change colour in autumn?",
        "Write a short story about a lost umbrella.",
    ],
    "code": [
        "Write a Python function that returns the median of a list of numbers.",
        "Write a Python function that counts how many times each word appears in a string.",
        "Write a Python class for a queue with enqueue, dequeue and is_empty methods.",
        "Write a Python function that checks whether a year is a leap year.",
        "Write a Python function that returns the second largest number in a list.",
        "Write a Python function that converts a Roman numeral to an integer.",
    ],
}
