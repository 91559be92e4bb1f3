"""The prompts the real model answers to make its draft's training data (``llm.distill``).

Three rounds of chat and code requests built from topics and task templates, none of them in
``llm.prompts``' bench sets (``tests/test_llm.py`` checks): ``training_prompts`` lists them in
the order ``distill.make_data`` answers them in batches.
"""

from __future__ import annotations

import random

__all__ = ["training_prompts"]

_TOPICS = (
    "the water cycle|photosynthesis|the French Revolution|black holes|how vaccines work|the "
    "stock market|climate change|the Roman Empire|machine learning|the human heart|volcanoes|"
    "the internet|democracy|coffee|sleep|honey bees|the moon landing|electric cars|recycling|"
    "the Renaissance|earthquakes|inflation|the immune system|Shakespeare|chess|gardening|the "
    "ocean tides|rainbows|the printing press|solar panels|dinosaurs|the brain|music theory|"
    "bread baking|the Great Wall of China|exercise|friendship|time management|public speaking|"
    "learning a language|saving money|healthy eating|the solar system|gravity|electricity|"
    "magnets|the periodic table|DNA|evolution|ancient Egypt|the Olympics|football|cats|dogs|"
    "forests|deserts|rivers|mountains|cities|trains|airplanes|bicycles|photography|painting|"
    "poetry|novels|history of mathematics|prime numbers|probability|statistics|databases|"
    "operating systems|cybersecurity|passwords|cloud computing|smartphones|video games|social "
    "media|newspapers|libraries|museums|teachers|doctors|farmers|weather forecasts|hurricanes|"
    "snow|the seasons|tea|chocolate|cheese|pizza|rice|spices|wine making|the Silk Road|the "
    "Vikings|the Industrial Revolution|World War I|the Cold War|human rights|philosophy|ethics|"
    "psychology|happiness|stress|meditation|habits|motivation|job interviews|writing an email|"
    "starting a business|marketing|teamwork|leadership|negotiation|renewable energy|nuclear "
    "power|batteries|plastic pollution|coral reefs|whales|birds migration|butterflies"
).split("|")
_TEMPLATES = (
    "Explain {t} to a ten-year-old.|Write a short essay about {t}.|What are three interesting "
    "facts about {t}?|Give me a brief history of {t}.|Why is {t} important?|Write a poem about "
    "{t}.|Summarize the main ideas of {t} in a paragraph.|What are the pros and cons of {t}?|"
    "Write a short story that involves {t}.|How would you teach a class about {t}?|List five "
    "questions a student might ask about {t}, with answers.|Describe {t} in simple terms.|What "
    "is a common misconception about {t}?|Write a blog post introduction about {t}.|Compare {t} "
    "with something similar and explain the differences.|What should a beginner know about {t}?"
    "|Write a dialogue between two friends discussing {t}.|Give me some tips related to {t}.|"
    "How has {t} changed over time?|Write a persuasive paragraph about {t}."
).split("|")
_CODE = (
    "Write a Python function that reverses a string.|Write a Python function to check whether a "
    "number is prime.|Write a Python class for a simple bank account with deposit and withdraw "
    "methods.|Write a Python function that returns the n-th Fibonacci number.|Write a Python "
    "script that counts the words in a text file.|Write a Python function that merges two "
    "sorted lists.|Write a function in JavaScript that removes duplicates from an array.|Write "
    "a Python function that computes the factorial of a number recursively.|Write a SQL query "
    "that selects the ten most recent orders from a table named orders.|Write a Python function"
    " to find the largest element in a list without using max.|Write a Python function that "
    "checks whether a string is a palindrome.|Write a binary search function in Python.|Write a"
    " Python function that converts Celsius to Fahrenheit.|Write a bash command that lists all "
    "files larger than 1 MB in a directory.|Write a Python function that flattens a nested "
    "list.|Write a Python function that sorts a list of dictionaries by a key.|Write a C "
    "function that swaps two integers.|Write a Python generator that yields the squares of "
    "numbers up to n.|Write a Python function that reads a CSV file and returns the average of "
    "a column.|Write a Python function that counts vowels in a string.|Explain what a Python "
    "decorator is and give an example.|Write a Python function that validates an email address"
    " with a regular expression.|Write a Python program that prints a multiplication table.|"
    "Write a Python function that implements bubble sort."
).split("|")


# The second round: open questions as people ask a chat model, on everyday subjects, and more
# code tasks. None is a bench prompt (``llm.prompts.PROMPT_SETS``; tests/test_llm.py checks).
_SUBJECTS = (
    "keeping houseplants alive|moving to a new city|learning to swim|board games|camping|"
    "penguins|octopuses|the pyramids|rainforests|the northern lights|baking cookies|running a "
    "marathon|learning the guitar|owning a rabbit|planning a wedding|the first day of school|"
    "writing a CV|volunteering|composting|bird watching|sourdough bread|traffic jams|"
    "thunderstorms|jellyfish|the Amazon river|knitting|skateboarding|robots|trees in winter|"
    "old castles|lighthouses|space stations|submarines|wolves|elephants|tomatoes|bridges|"
    "clocks|maps|postcards|the alphabet|fireworks|rainy days|island life|mountain climbing|"
    "a school science fair|street markets|family recipes|city parks|train journeys|road "
    "trips|summer holidays|packing a suitcase|saving for a bicycle|a birthday party|learning "
    "to cook|a power cut|a broken phone screen|noisy neighbours|a tidy desk|morning routines|"
    "pet goldfish|hedgehogs|frogs|glaciers|caves|deserts at night|the Arctic|sea turtles|"
    "sunflowers|a village bakery|a football match|a library card|a museum visit|a science "
    "museum|an old diary|a treasure map|a snowy morning|a lost key|a paper boat|a kite"
).split("|")
_QUESTIONS = (
    "Tell me how {t} works.|What would I need to know about {t}?|Give me advice about {t}.|"
    "Why do people enjoy {t}?|Write a short story about {t}.|What are some good ways to get "
    "started with {t}?|Can you tell me something surprising about {t}?|What do people often "
    "get wrong about {t}?|Describe {t} to someone who has never heard of it.|Write a friendly "
    "letter to a friend about {t}.|What are the most important things about {t}?|How can I "
    "explain {t} to my grandmother?|Tell me a fun fact about {t} and explain it.|What could go "
    "wrong with {t}, and how do I avoid it?|Write a short poem about {t}.|I am curious about "
    "{t}. Where should I begin?"
).split("|")
_CODE_MORE = (
    "Write a Python function that removes all spaces from a string.|Write a Python function "
    "that returns the sum of the digits of a number.|Write a Python class for a stack with "
    "push, pop and peek methods.|Write a Python function that finds the most common element in "
    "a list.|Write a Python function that checks whether two strings are anagrams.|Write a "
    "Python function that returns all even numbers in a list.|Write a Python function that "
    "capitalises the first letter of every word.|Write a Python function that computes the "
    "greatest common divisor of two numbers.|Write a Python class for a rectangle with area "
    "and perimeter methods.|Write a Python function that reverses the order of words in a "
    "sentence.|Write a Python function that returns the average of a list of numbers.|Write a "
    "Python function that checks whether a list is sorted.|Write a Python function that "
    "converts a list of strings to upper case.|Write a Python function that counts the lines "
    "in a file.|Write a Python function that returns the minimum and maximum of a list.|Write "
    "a Python function that removes duplicates from a list while keeping order.|Write a Python"
    " function that computes the power of a number without using **.|Write a Python function "
    "that checks whether a number is a perfect square.|Write a Python class for a to-do list "
    "with add, remove and show methods.|Write a Python function that returns the length of the"
    " longest word in a sentence.|Write a Python function that converts minutes to hours and "
    "minutes.|Write a Python function that merges two dictionaries.|Write a Python function "
    "that returns the first n prime numbers.|Write a Python function that rotates a list by k "
    "positions."
).split("|")


# The third round: requests of every kind a chat model gets (explain, advise, plan, compare,
# write, list, define), on subjects from daily life, work, science, places and hobbies,
# wider than the first two rounds' templates. None is a bench prompt (tests/test_llm.py).
_AREAS = (
    "cooking pasta|a rainy weekend|learning to drive|a job interview|a noisy office|a new "
    "puppy|a vegetable garden|a budget for groceries|a school project|a long flight|a museum "
    "trip|a science fair volcano|a broken bicycle|a birthday cake|a camping trip in the "
    "mountains|a beach holiday|a book club|a chess tournament|a piano lesson|a yoga class|a "
    "marathon training plan|a small bakery|a lemonade stand|a recycling campaign|a community "
    "garden|a moving day|a wedding speech|a thank-you note|a cover letter|a team meeting|a "
    "presentation at work|a difficult conversation with a friend|a family reunion|a picnic|a "
    "snowy winter|a hot summer day|a power outage|a flat tyre|a lost passport|a new phone|a "
    "slow computer|a strong password|a first website|a spreadsheet|an online course|a "
    "podcast|a short film|a photo album|a travel diary|a city map|the water in the ocean|the "
    "speed of light|the human skeleton|the stars at night|the wind|clouds|sound|magnetism|"
    "bacteria|plants in the desert|coral|wolves in the wild|bees in winter|owls|sharks|"
    "tigers|pandas|horses|parrots|tea from China|coffee from Ethiopia|olive oil|bread in "
    "France|rice in Japan|markets in Morocco|trains in Switzerland|canals in Venice|the "
    "Sahara|the Himalayas|the Nile|Iceland|Canada in autumn|Australia's animals|the Moon's "
    "craters|Mars|the Sun|Saturn's rings|comets|earth's layers|fossils|ancient Rome|the "
    "Middle Ages|the Egyptian pyramids|the first computers|the invention of the telephone|"
    "the history of chocolate|the history of the bicycle|jazz|painting with watercolours|"
    "learning to knit|origami|juggling|bird feeders|houseplants in winter|saving energy at "
    "home|drinking more water|sleeping better|a morning walk|stretching|a healthy breakfast"
).split("|")
_REQUESTS = (
    "Can you explain {t} in simple words?|What should I know before {t}?|Help me plan {t}.|"
    "What are the best tips for {t}?|Write a short paragraph about {t}.|Write a short poem "
    "about {t}.|Write a short story about {t}.|Give me three fun facts about {t}.|What is the "
    "most interesting thing about {t}?|How would you describe {t} to a child?|What mistakes "
    "do people make with {t}?|Make a simple checklist for {t}.|Write a friendly email about "
    "{t}.|What are the good and bad sides of {t}?|Why do people care about {t}?|Tell me the "
    "story of {t}.|How does {t} work?|What questions should I ask about {t}?|Give me a "
    "step-by-step guide to {t}.|What would a beginner find hard about {t}?|Summarize what "
    "you know about {t} in a few sentences.|Write a short diary entry about {t}.|Write a "
    "dialogue between a teacher and a student about {t}.|What could I learn from {t}?"
).split("|")


def training_prompts(seed: int = 0) -> list[str]:
    """The prompts ``make_data`` answers, in batch order. First the first round (every topic
    under every template and each code task eight times, shuffled; the shipped draft's first
    42 batches of 32 are its first 1,344), then the second round: open questions on
    everyday subjects and more code tasks, each code task four times, shuffled; then the third
    round, requests of every kind on wider subjects, shuffled (not in the shipped draft's
    data: its 78 batches end inside the second round); then the rest of the first round."""
    first = [tpl.format(t=t) for t in _TOPICS for tpl in _TEMPLATES] + _CODE * 8
    random.Random(seed).shuffle(first)
    second = [q.format(t=t) for t in _SUBJECTS for q in _QUESTIONS] + _CODE_MORE * 4
    random.Random(seed + 1).shuffle(second)
    third = [r.format(t=t) for t in _AREAS for r in _REQUESTS]
    random.Random(seed + 2).shuffle(third)
    return first[:1344] + second + third + first[1344:]
