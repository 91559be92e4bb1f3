"""The real model's three prompt sets: input-grounded, open chat, code writing.

None of them is in the draft's training prompts (``llm.distill`` draws from other topics and
tasks; tests/test_llm.py checks), so the trained draft is measured on text it never saw.

The grounded prompts give the model a passage and ask for a copy, a quotation, a summary or a
rewording: the answer repeats long spans of its input, the case prompt lookup is for. They
were chosen by what the model does with them, not by any speedup: a prompt is grounded when
most of SmolLM2-135M's own plain greedy answer (``bench llm`` records the share, under
``"grounding"``) lies in 4-token runs of the prompt. Asked to edit code (add docstrings,
rename a variable, comment every line) or to copy a notice and list its rules, this 135M
model wrote something else (0-47% of its answer from the prompt), so no code edit is among
them; one asked to reword a notice for children repeated one word. The code set asks for
new code.
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
PROMPT_SETS = {
    "grounded": [
        f"Repeat the following passage word for word, then give it a title.\n\n{_LIGHTHOUSE}",
        f"Summarise this passage in three sentences, quoting its dates exactly.\n\n{_LIGHTHOUSE}",
        "Quote the sentence of this passage that mentions Martha Hale's logbook, then explain "
        f"it.\n\n{_LIGHTHOUSE}",
        f"Correct any mistakes in this passage and return it in full.\n\n{_LIGHTHOUSE}",
        "Turn this notice into a list of facts, one per line, using its own words.\n\n" + _BAKERY,
        "Translate this notice into simpler English, sentence by sentence.\n\n" + _BAKERY,
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
