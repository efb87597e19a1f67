"""The embedded draft's training prompts, and the held-out check that keeps them apart from the
evaluation set.

Version 1 (``training_prompts``): templates x topics, word problems and code tasks, 824 prompts. The
wide set of version 2 (issue 15, ``wide_prompts``): thousands of prompts over many task types, built
combinatorially and deterministically from the lists below: explanations, how-to, lists, comparisons,
short stories, poems, emails and letters, summaries and rewrites of a given text, code, arithmetic
word problems, small talk, advice, definitions, factual questions, opinions and classification, plus
version 1's prompts. Questions written by the target itself are added by ``scripts/draft_data.py
questions``; this module only builds the fixed part.

No prompt may repeat a held-out prompt of assets/prompts.json (the evaluation and benchmark set):
``wide_prompts`` calls ``assert_no_held_out`` and raises if one does. The held-out themes (sky colour,
aeroplanes, seasons, weather vs climate, refrigerators, leap years, DNA, noise-cancelling headphones,
exercise, compasses, autumn leaves, ...) are also left out of the topic lists on purpose, so held-out
acceptance measures generalisation, not recall.

    python scripts/draft_prompts.py     # counts per task type and a few examples
"""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path
from typing import Iterable

# ----------------------------------------------------------------------------- version 1
V1_TEMPLATES = [
    "Explain {t} to a ten-year-old.",
    "What are the main facts everyone should know about {t}?",
    "Write a short story that involves {t}.",
    "Write a poem about {t}.",
    "Give me five tips related to {t}.",
    "What is the history of {t}? Answer in a paragraph.",
    "Describe the pros and cons of {t}.",
    "Write a short blog post introduction about {t}.",
    "How would you teach a beginner about {t}? Give a step-by-step plan.",
    "Summarise the key ideas behind {t} in three sentences.",
    "Write a dialogue between two friends discussing {t}.",
    "What are common misconceptions about {t}?",
    "Write a haiku and then a limerick about {t}.",
    "Answer briefly: why does {t} matter?",
]
V1_TOPICS = [
    "photosynthesis", "volcanoes", "the French Revolution", "black holes", "recycling", "honey bees",
    "the water cycle", "electric cars", "chess", "the Roman Empire", "vaccines", "rainbows",
    "machine learning", "the human heart", "coffee", "the Moon landing", "earthquakes", "penguins",
    "saving money", "learning a new language", "climate change", "the internet", "dinosaurs",
    "gardening", "the Olympic Games", "sleep", "friendship", "mountains", "jazz music", "bread baking",
    "solar panels", "the printing press", "octopuses", "time management", "the pyramids of Egypt",
    "public libraries", "bicycles", "the immune system", "deserts", "cloud computing",
    "the stock market", "Mars exploration", "origami", "rain forests", "the piano", "healthy eating",
    "trains", "lighthouses", "the periodic table", "birds migrating", "video games", "tea",
]
V1_MATH = [
    "A shop sells pencils at {a} cents each. How much do {b} pencils cost? Explain step by step.",
    "Tom has {a} apples and gives away {b}. Then he buys {c} more. How many apples does he have?",
    "A train travels {a} km in {b} hours. What is its average speed? Show your work.",
    "What is {a} times {b}, plus {c}? Work it out step by step.",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
    "If {a} workers build a wall in {b} days, how long would {c} workers take? Explain.",
]
V1_CODE = [
    "Write a Python function that {t}.",
    "Explain what this does and improve it: a Python loop that {t}.",
]
V1_CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the words in a sentence",
    "returns the largest item of a list", "computes the factorial of n", "merges two sorted lists",
    "removes duplicates from a list", "converts Celsius to Fahrenheit", "reads a file and counts lines",
    "finds the average of a list of numbers", "checks if a word is a palindrome", "sorts a dictionary by value",
]


def training_prompts(seed: int = 0) -> list[str]:
    """Version 1's 824 prompts (templates x topics, word problems, code), shuffled for a seed."""
    rng = random.Random(seed)
    out = [t.format(t=topic) for t, topic in itertools.product(V1_TEMPLATES, V1_TOPICS)]
    for tpl in V1_MATH:
        for _ in range(12):
            a, b, c = rng.randint(2, 60), rng.randint(2, 12), rng.randint(2, 30)
            out.append(tpl.format(a=a, b=b, c=c))
    out += [t.format(t=task) for t, task in itertools.product(V1_CODE, V1_CODE_TASKS)]
    rng.shuffle(out)
    return out


def held_out_prompts() -> list[dict[str, str]]:
    path = Path(__file__).resolve().parent.parent / "assets" / "prompts.json"
    return json.loads(path.read_text())["prompts"]


class HeldOutLeak(ValueError):
    """A training prompt equals, contains, or nearly repeats a held-out prompt of assets/prompts.json."""


_STOP = set("""a an the and or but of to in on at for from by with about as is are was were be been it its this
that these those what which who whom whose why how when where do does did doing can could would should will
shall may might must i you he she we they me him her us them my your his our their there here not no so if
then than too very just into out up down over under again more most some any each every all both few other
such only own same one two three after before while during because through between also please write give tell
explain describe""".split())


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def near_held_out(prompt: str, held: Iterable[str], jaccard: float = 0.6) -> str | None:
    """The held-out prompt that ``prompt`` repeats, else None. A repeat is: the same words (case,
    spacing and punctuation ignored); one containing the other (4+ words); or content-word sets
    (stop words dropped) sharing 2+ words with Jaccard similarity >= ``jaccard`` (a reworded copy,
    e.g. the same word problem with other phrasing)."""
    w = _words(prompt)
    s, ws = " ".join(w), {x for x in w if x not in _STOP}
    for h in held:
        hw = _words(h)
        hs, hws = " ".join(hw), {x for x in hw if x not in _STOP}
        if s == hs or (len(hw) >= 4 and f" {hs} " in f" {s} ") or (len(w) >= 4 and f" {s} " in f" {hs} "):
            return h
        common = len(ws & hws)
        if common >= 2 and common / len(ws | hws) >= jaccard:
            return h
    return None


def held_out_leaks(prompts: Iterable[str], held: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(training prompt, held-out prompt) for every training prompt that repeats a held-out one."""
    held = [x["prompt"] for x in held_out_prompts()] if held is None else list(held)
    return [(p, h) for p in prompts if (h := near_held_out(p, held)) is not None]


def assert_no_held_out(prompts: Iterable[str], held: Iterable[str] | None = None) -> None:
    """Fail loudly if any training prompt repeats a held-out prompt (assets/prompts.json)."""
    leaks = held_out_leaks(prompts, held)
    if leaks:
        shown = "\n".join(f"  {p!r} ~ held-out {h!r}" for p, h in leaks[:10])
        raise HeldOutLeak(f"{len(leaks)} training prompt(s) repeat held-out prompts of assets/prompts.json "
                          f"(the evaluation set must never be trained on):\n{shown}")


# ----------------------------------------------------------------------------- topics
SCIENCE = [
    "gravity", "magnets", "electricity", "sound waves", "light and shadows", "atoms", "molecules",
    "chemical reactions", "the speed of light", "friction", "static electricity", "evaporation",
    "clouds", "thunder and lightning", "tides", "the solar system", "comets", "galaxies", "stars",
    "the Big Bang", "fossils", "evolution", "cells", "bacteria", "viruses", "the brain", "the lungs",
    "bones", "muscles", "digestion", "blood", "the five senses", "genes and heredity", "plate tectonics",
    "glaciers", "coral reefs", "ocean currents", "the ozone layer", "acids and bases", "crystals",
    "nuclear energy", "wind power", "batteries", "semiconductors", "lasers", "telescopes", "microscopes",
    "mushrooms", "pollination", "food chains", "camouflage in animals", "hibernation", "whales",
    "ants", "spiders", "sharks", "elephants", "wolves", "butterflies", "frogs", "owls", "trees",
    "cactus plants", "the carbon cycle", "renewable energy", "soil", "caves", "rivers", "islands",
    "hurricanes", "tornadoes", "snowflakes", "the northern lights", "eclipses", "meteor showers",
    "the International Space Station", "satellites", "rockets", "robots", "3D printing",
    "artificial intelligence", "smartphones", "computer memory", "encryption", "email",
    "search engines", "social media", "open source software", "databases", "computer viruses",
    "wifi", "GPS navigation", "electric motors", "steam engines", "bridges", "skyscrapers", "dams",
    "submarines", "hot air balloons", "helicopters", "ships", "tunnels", "the wheel", "clocks",
    "paper", "glass", "plastic", "steel", "concrete", "cotton", "salt", "sugar", "chocolate",
]
SOCIETY = [
    "ancient Greece", "the Vikings", "the Silk Road", "the Renaissance", "the Industrial Revolution",
    "the Great Wall of China", "the Aztecs", "ancient Rome's roads", "medieval castles", "knights",
    "the invention of writing", "the first computers", "the telephone", "the radio", "photography",
    "cinema", "democracy", "elections", "taxes", "banks", "inflation", "supply and demand", "trade",
    "money", "credit cards", "insurance", "budgets", "small businesses", "advertising", "marketing",
    "teamwork", "leadership", "negotiation", "public speaking", "job interviews", "remote work",
    "volunteering", "charities", "cities", "villages", "farming", "fishing", "tourism", "museums",
    "theatre", "opera", "ballet", "painting", "sculpture", "architecture", "fashion", "folk tales",
    "mythology", "board games", "football", "basketball", "tennis", "swimming", "running marathons",
    "yoga", "meditation", "camping", "hiking", "cooking pasta", "baking cakes", "vegetarian food",
    "spices", "rice", "cheese", "pizza", "soup", "breakfast", "table manners", "birthdays",
    "weddings", "holidays around the world", "New Year traditions", "pets", "dogs", "cats",
    "horses", "aquariums", "zoos", "national parks", "beaches", "forests", "lakes", "maps",
    "languages", "dictionaries", "poetry", "novels", "comic books", "newspapers", "podcasts",
    "music festivals", "the guitar", "the violin", "drums", "choirs", "photography at night",
    "handwriting", "calligraphy", "knitting", "woodworking", "pottery", "painting a room",
    "moving to a new city", "first aid", "road safety", "recycling electronics", "composting",
    "saving water", "public transport", "car maintenance", "home insurance", "renting a flat",
]
TOPICS = SCIENCE + SOCIETY

EXPLAIN = [
    "Explain {t} in simple terms.",
    "Explain {t} to a ten-year-old.",
    "How does {t} work?",
    "What is {t}? Give a short explanation.",
    "Give me a beginner's overview of {t}.",
    "Tell me three interesting facts about {t}.",
    "Why is {t} important?",
    "What should a curious student know about {t}?",
    "Write a short encyclopedia entry about {t}.",
    "Describe {t} in one paragraph.",
    "What are the most common questions people have about {t}? Answer two of them.",
    "Explain {t} using an everyday analogy.",
    "What is the history of {t}, in brief?",
    "What are the advantages and disadvantages of {t}?",
    "Write a short quiz with three questions about {t}, with answers.",
    "Summarise what scientists or experts know about {t}.",
    "What would happen if {t} did not exist?",
    "Write a paragraph for a school textbook about {t}.",
    "Describe {t} to someone who has never heard of it.",
    "What are some surprising things about {t}?",
    "Create a short lesson plan about {t}.",
    "Give an outline for a five-minute talk about {t}.",
    "Write a tweet-length fun fact about {t}.",
    "What jobs or careers are connected to {t}?",
]
HOWTO = [
    "make a cup of tea", "plant tomatoes", "tie a tie", "change a flat tyre", "write a cover letter",
    "start running", "learn to juggle", "make pancakes", "organise a closet", "clean a laptop keyboard",
    "prepare for an exam", "make a budget", "fall asleep faster", "care for a houseplant",
    "write a good essay", "make friends in a new city", "start a vegetable garden", "bake bread at home",
    "train a puppy", "brew coffee with a French press", "pack for a weekend trip", "paint a wall",
    "read faster", "take better photos with a phone", "set up a fish tank", "cook rice",
    "make a paper airplane", "learn to swim as an adult", "save for a holiday", "give a toast at a wedding",
    "write a thank-you note", "build a birdhouse", "fix a leaking tap", "make a smoothie",
    "organise a birthday party", "learn to play the guitar", "stay focused while studying",
    "prepare for a job interview", "make a to-do list that works", "reduce food waste",
    "start journaling", "learn touch typing", "make homemade soup", "wash a wool sweater",
    "back up the files on a computer", "choose a good password", "plan a road trip",
    "keep a conversation going", "make a simple website", "sharpen a kitchen knife",
    "sew on a button", "make a salad dressing", "clean a bicycle chain", "grow herbs on a windowsill",
    "start learning chess", "write a short story", "memorise a poem", "make a pot of chili",
    "host a board game night", "get better at drawing", "make cold brew coffee", "meditate for beginners",
    "set goals for the new year", "store fresh vegetables", "make a cheese sandwich",
    "write a professional email", "prepare a presentation", "make a family tree",
    "clean windows without streaks", "choose a book to read", "teach a child to ride a bike",
]
HOWTO_FORMS = [
    "How do I {h}?",
    "Give me step-by-step instructions to {h}.",
    "What is the easiest way to {h}?",
    "I want to {h}. Where should I start?",
    "List the steps to {h}, with a tip for each.",
    "Explain how to {h} for a complete beginner.",
]
LIST_SUBJECTS = [
    "fruits that are high in vitamin C", "famous inventors", "ways to relax after work", "indoor hobbies",
    "outdoor activities for kids", "healthy snacks", "classic novels", "countries in Europe",
    "animals that live in the ocean", "things to pack for a beach day", "ways to save energy at home",
    "uses for baking soda", "board games for families", "musical instruments", "kinds of clouds",
    "planets in the solar system", "good habits for students", "questions to ask at a job interview",
    "vegetables that grow quickly", "birds you can see in a city", "ways to be kind to others",
    "programming languages", "famous painters", "types of pasta", "herbs for cooking",
    "ideas for a rainy day", "things to do in a new city", "gift ideas for a teacher",
    "reasons to learn a second language", "signs of a good friend", "ways to reduce stress",
    "kitchen tools every cook needs", "dog breeds", "ways to stay warm in winter", "famous bridges",
    "things that are round", "words that rhyme with light", "names for a pet goldfish",
    "ideas for a science fair project", "breakfast ideas", "tips for a long flight",
    "skills a good manager needs", "things to do on a weekend", "common mistakes in English",
    "ways to make a room feel cosy", "desserts made with apples", "famous mountains",
    "ideas for a short story", "things to check before buying a used car", "safety rules in a lab",
]
LIST_FORMS = [
    "List five {s}.",
    "Name ten {s}, one per line.",
    "Give me a list of {s} with a short note on each.",
    "What are some {s}?",
    "Make a numbered list of {s}.",
]
COMPARE = [
    ("cats", "dogs"), ("tea", "coffee"), ("trains", "planes"), ("books", "films"), ("the Sun", "the Moon"),
    ("rivers", "lakes"), ("Python", "JavaScript"), ("renting", "buying a home"), ("running", "swimming"),
    ("summer holidays", "winter holidays"), ("city life", "country life"), ("paper books", "e-books"),
    ("bicycles", "cars"), ("frogs", "toads"), ("butter", "margarine"), ("viruses", "bacteria"),
    ("solar power", "wind power"), ("chess", "checkers"), ("the piano", "the guitar"), ("oceans", "seas"),
    ("crocodiles", "alligators"), ("weather forecasts", "astrology"), ("saving", "investing"),
    ("emails", "phone calls"), ("working from home", "working in an office"), ("stars", "planets"),
    ("baking", "frying"), ("mountains", "hills"), ("poems", "songs"), ("laptops", "tablets"),
    ("lions", "tigers"), ("bees", "wasps"), ("apples", "oranges"), ("democracy", "monarchy"),
    ("a list", "a dictionary in Python"), ("hardware", "software"), ("jogging", "walking"),
    ("museums", "zoos"), ("rice", "bread"), ("novels", "short stories"), ("meteors", "comets"),
    ("speed", "velocity"), ("weight", "mass"), ("a virus", "a computer virus"), ("a loan", "a gift"),
    ("hurricanes", "tornadoes"), ("glass", "plastic"), ("ballet", "hip hop dance"), ("sushi", "sandwiches"),
]
COMPARE_FORMS = [
    "What is the difference between {a} and {b}?",
    "Compare {a} and {b} in a short table or list.",
    "Which is better, {a} or {b}? Give arguments for both.",
    "How are {a} and {b} alike, and how are they different?",
]
CHARACTERS = [
    "a shy robot", "an old fisherman", "a curious girl", "a lazy cat", "a brave mouse", "a young wizard",
    "a retired teacher", "a lost puppy", "a talking tree", "a clumsy knight", "a baker", "a twin brother",
    "a grumpy neighbour", "a street musician", "a detective", "a farmer", "a tiny dragon", "a pirate",
    "an inventor", "a nervous student", "a kind ghost", "a wise owl", "a queen", "a bus driver",
    "a painter", "a space explorer", "a snowman", "a hedgehog", "a mail carrier", "a chef",
]
SETTINGS = [
    "in a busy market", "on a mountain top", "in a small village", "under the sea", "in a haunted house",
    "in a big city at night", "in a desert", "on a farm", "in a library", "on a distant planet",
    "in a forest", "at a birthday party", "in a school", "on a bus", "in a castle", "at the zoo",
    "in a bakery", "at a train station", "during a storm", "in the year 3000",
]
STORY_FORMS = [
    "Write a short story about {c} {s}.",
    "Tell a story in which {c} {s} learns something important.",
    "Write a funny story about {c} {s}.",
    "Write a story of five sentences about {c} {s}.",
    "Write a fable about {c} {s}, with a moral at the end.",
    "Write the beginning of an adventure story about {c} {s}.",
]
POEM_SUBJECTS = [
    "the ocean", "a city at night", "a sleeping cat", "friendship", "the first snow", "a cup of coffee",
    "the stars", "a garden in spring", "a rainy morning", "a train journey", "a grandmother's kitchen",
    "the wind", "a lost key", "a summer evening", "the moon over a lake", "a busy street", "home",
    "an old tree", "a bird singing", "hope", "courage", "time", "silence", "a sunrise", "the desert",
    "a river", "a birthday", "a library", "a bicycle", "bread", "the sea shore", "a candle",
    "a mountain path", "a fox", "a thunderstorm", "the end of a school day", "a lighthouse beam",
    "music", "a snail", "a kite", "memories", "a new beginning", "the sound of rain", "an empty room",
]
POEM_FORMS = [
    "Write a poem about {p}.", "Write a haiku about {p}.", "Write a limerick about {p}.",
    "Write a four-line rhyming poem about {p}.", "Write a free verse poem about {p}.",
    "Write an acrostic poem about {p}.", "Write a short poem for children about {p}.",
    "Write a sonnet about {p}.",
]
EMAIL_PURPOSES = [
    "asking my manager for a day off", "thanking a colleague for their help", "inviting friends to a picnic",
    "complaining about a late delivery", "asking a teacher for an extension", "apologising for missing a meeting",
    "welcoming a new team member", "requesting a refund", "asking a neighbour to keep the noise down",
    "confirming a dentist appointment", "following up after a job interview", "announcing a bake sale",
    "asking for feedback on a report", "declining a party invitation politely", "asking a landlord to fix the heating",
    "congratulating a friend on a new job", "reminding the team about a deadline", "introducing myself to a new client",
    "asking a professor a question about homework", "cancelling a gym membership", "organising a team lunch",
    "thanking a host after a dinner", "asking for a recommendation letter", "reporting a bug to a software company",
    "planning a family reunion", "asking a shop whether an item is in stock", "inviting a speaker to a school event",
    "telling my team about a new office rule", "asking to reschedule a meeting", "thanking a customer for an order",
]
EMAIL_FORMS = [
    "Write an email {e}.", "Write a short, polite email {e}.", "Draft a friendly message {e}.",
    "Write a formal letter {e}.",
]
PASSAGES = [
    "The city council voted on Tuesday to build a new park on the site of an old car factory. The park will "
    "have a playground, a pond and a small cafe. Work will begin next spring and should take two years. Some "
    "residents worry about the cost, but most say the area badly needs green space.",
    "Honey never really spoils. Archaeologists have found pots of honey in ancient tombs that are thousands of "
    "years old and still edible. Its low water content and natural acidity stop bacteria from growing. Bees "
    "make honey from flower nectar, which they store and dry inside the hive.",
    "Our company will move to a four-day work week from June. Staff will work the same number of hours over "
    "four longer days. The trial will last six months, after which we will ask everyone for feedback. Customer "
    "support will still be available five days a week through a rota.",
    "Maria started learning the violin at the age of forty. At first she practised for ten minutes a day, and "
    "her neighbours were not impressed. After three years she joined a local orchestra. She says the secret "
    "was to enjoy small improvements rather than waiting to be good.",
    "Sleep is when the body repairs itself and the brain stores memories. Adults need about seven to nine hours "
    "a night. Screens before bed can make it harder to fall asleep because their light tells the brain it is "
    "still day. A regular bedtime helps the body keep a steady rhythm.",
    "The library will be closed next Monday for repairs to the roof. Books due that day can be returned on "
    "Tuesday without a fine. The online catalogue and e-book service will work as usual. We thank readers for "
    "their patience.",
    "Octopuses have three hearts and blue blood. They can change the colour and texture of their skin in a "
    "fraction of a second to hide from predators. Each arm has its own cluster of nerve cells, so an arm can "
    "react to touch without waiting for the brain.",
    "The first bicycles, built in the early nineteenth century, had no pedals. Riders pushed themselves along "
    "with their feet. Pedals came later, fixed to the front wheel, which is why some early bikes had huge front "
    "wheels. The chain-driven bicycle with two equal wheels appeared in the 1880s.",
    "Tom ordered a blue jacket online, but a red one arrived. He called the shop, and they apologised and sent "
    "the right jacket the next day with a free scarf. Tom was so pleased that he left a five-star review and "
    "recommended the shop to his friends.",
    "Regular breaks make people more productive. A short walk or a few minutes away from the screen every hour "
    "helps the mind reset. Studies of office workers found that those who took planned breaks made fewer "
    "mistakes in the afternoon than those who worked straight through.",
    "The village bakery has been run by the same family for four generations. Every morning at four o'clock the "
    "ovens are lit and the first loaves are ready by six. The recipe for their rye bread has never been written "
    "down; it is taught by hand from parent to child.",
    "A new study suggests that children who read for fun at least twenty minutes a day have a larger vocabulary "
    "by the age of twelve. The effect was the same for printed books and e-books. Researchers say the key is "
    "choosing books children actually enjoy.",
    "Volcanic islands form when magma rises through the ocean floor and builds up layer by layer. Over "
    "millions of years the island can grow tall enough to break the surface. Hawaii is a chain of such islands, "
    "formed as the Pacific plate slowly moved over a hot spot.",
    "Please remember that the school trip to the science museum leaves at eight thirty on Friday. Pupils should "
    "bring a packed lunch, a water bottle and a coat. The coach will return at three o'clock. Parents who have "
    "not yet returned the permission form should do so by Wednesday.",
    "Compound interest means earning interest on your interest. If you save 100 dollars at five percent a year, "
    "you have 105 after one year and about 110.25 after two. Over decades the growth speeds up, which is why "
    "starting to save early makes such a difference.",
    "The team finished the project two weeks late because the supplier delivered the parts late and two "
    "engineers were ill. The client was disappointed but agreed that the final product was excellent. Next "
    "time, the team plans to order parts earlier and keep a small buffer in the schedule.",
    "Penguins cannot fly, but they are excellent swimmers. Their wings have evolved into flippers, and their "
    "bodies are shaped like torpedoes. Emperor penguins can dive more than five hundred metres deep and hold "
    "their breath for over twenty minutes.",
    "The recipe is simple: mix two cups of flour, one cup of milk, two eggs and a pinch of salt. Let the batter "
    "rest for half an hour. Cook thin layers in a hot buttered pan for about a minute on each side, and serve "
    "with lemon and sugar.",
    "Wind turbines turn the energy of moving air into electricity. The wind spins the blades, which turn a shaft "
    "connected to a generator. Modern turbines can be taller than a football field is long, and a single one "
    "can power thousands of homes.",
    "Last weekend the town held its first street food festival. More than forty stalls sold dishes from around "
    "the world, and local bands played until late. The organisers counted over ten thousand visitors and plan "
    "to make the festival a yearly event.",
    "Good passwords are long and hard to guess. A sentence of four random words is easier to remember and harder "
    "to crack than a short word with symbols. Using a different password for every site means that one leak "
    "does not open all your accounts.",
    "The Amazon river carries more water than any other river on Earth. It flows through several countries in "
    "South America and ends in the Atlantic Ocean. The rainforest around it is home to millions of species, "
    "many of which have not yet been described by scientists.",
    "Dear customers, from the first of next month our opening hours will change. We will open at nine instead "
    "of eight on weekdays, and stay open until seven. On Sundays we will be closed. Online orders will still be "
    "delivered every day.",
    "Chess began in India around fifteen hundred years ago as a game called chaturanga. It spread to Persia and "
    "then to Europe, where the rules slowly changed. The queen became the most powerful piece only around the "
    "end of the fifteenth century.",
]
PASSAGE_TASKS = [
    "Summarise the following text in one sentence:\n\n{x}",
    "Summarise this in three bullet points:\n\n{x}",
    "Give this text a short title:\n\n{x}",
    "What is the main point of this text?\n\n{x}",
    "Explain this text to a child:\n\n{x}",
    "Write two questions a reader could answer from this text, with the answers:\n\n{x}",
    "Rewrite this text in a more casual tone:\n\n{x}",
    "TL;DR:\n\n{x}",
    "Read the text and list the key facts.\n\n{x}",
    "Write a one-paragraph summary of this:\n\n{x}",
]
SENTENCES = [
    "me and him goes to the shop yesterday", "the meeting have been moved to thursday",
    "I am very very happy with the product it is good", "Can you send me the thing we talked about",
    "the weather is bad so we not going", "Their going to the park later with there dog",
    "This report is late because stuff happened", "we need more money for the project because of costs",
    "The cat sat on the mat and it was happy", "Thanks for the help it was really useful",
    "I think maybe we should possibly consider changing the plan", "the food was ok but the service slow",
    "Please find attached the document you requested", "He run fast but he lose the race",
    "Our new app helps people track their water intake", "The train was delayed by forty minutes this morning",
    "I can't come to the party tonight, sorry", "The results of the survey are interesting",
    "She don't like vegetables but she eat them anyway", "The price of the tickets has gone up again",
]
SENTENCE_TASKS = [
    "Fix the grammar in this sentence: \"{x}\"", "Rewrite this sentence to sound more formal: \"{x}\"",
    "Make this sentence shorter and clearer: \"{x}\"", "Rewrite this sentence in a friendly tone: \"{x}\"",
    "Translate this sentence into simple French: \"{x}\"",
]
CODE_TASKS = [
    "reverses a list", "counts vowels in a string", "checks whether a year is a leap year",
    "finds the second largest number in a list", "returns the n-th Fibonacci number", "flattens a nested list",
    "checks whether two strings are anagrams", "computes the greatest common divisor of two numbers",
    "converts a number to binary", "capitalises the first letter of every word", "finds all even numbers in a list",
    "sums the digits of a number", "counts how often each word appears in a text", "checks whether a list is sorted",
    "rotates a list by k positions", "removes punctuation from a string", "finds the longest word in a sentence",
    "computes the mean and median of a list", "validates an email address with a simple rule",
    "reads a CSV file and prints each row", "generates a random password", "implements binary search",
    "implements bubble sort", "converts kilometres to miles", "returns the unique items of a list in order",
    "merges two dictionaries", "transposes a matrix", "checks whether a string has balanced brackets",
    "counts the lines in a text file", "finds the minimum and maximum of a list", "computes a factorial recursively",
    "groups words by their first letter", "converts a string to title case", "chunks a list into pieces of size n",
    "calculates compound interest", "finds prime numbers below 100", "simulates rolling two dice",
    "parses a date string", "builds a simple to-do list class", "implements a stack with push and pop",
]
CODE_FORMS = [
    "Write a Python function that {c}.", "Write a Python function that {c}, with a docstring and an example.",
    "Show me how to write a JavaScript function that {c}.", "Explain, step by step, how to write code that {c}.",
    "Write a short Python script that {c} and explain how it works.",
]
CODE_QUESTIONS = [
    "What is a variable in programming?", "What is the difference between a list and a tuple in Python?",
    "What does a for loop do?", "What is recursion? Give a simple example.", "What is an API?",
    "Explain what a function is to a beginner programmer.", "What is object-oriented programming?",
    "What is the difference between an error and an exception in Python?", "What is Git used for?",
    "How do I read a file in Python?", "What is a dictionary in Python and when should I use one?",
    "What does `if __name__ == \"__main__\":` mean in Python?", "What is a SQL query? Give an example.",
    "How do I install a package with pip?", "What is the difference between `==` and `is` in Python?",
    "What are list comprehensions in Python?", "What is a class and what is an object?",
    "How do I sort a list of dictionaries by a key in Python?", "What is JSON?", "What is HTML used for?",
    "What does CSS do on a web page?", "What is a bug, and how do programmers find them?",
    "What is a unit test?", "What is the difference between a compiler and an interpreter?",
    "Write a SQL query that selects all customers from a table called customers who live in Paris.",
    "Write a regular expression that matches a five-digit number and explain it.",
]
MATH_TEMPLATES = [
    "Anna has {a} stickers. She gives {b} to her brother and buys {c} more. How many stickers does she have now?",
    "A farmer has {a} cows and each cow gives {b} litres of milk a day. How much milk is that per day?",
    "A bus carries {a} passengers. At the first stop {b} get off and {c} get on. How many are on the bus?",
    "A pizza is cut into {b} slices. If {c} friends share {a} pizzas equally, how many slices does each get? "
    "Explain.",
    "A bottle holds {a} millilitres. How many millilitres are in {b} bottles?",
    "Sam saves {b} dollars every week. How many weeks does he need to save {a0} dollars?",
    "A school has {a} classes with {b} pupils each. How many pupils are there in total?",
    "A cyclist rides at {b} km per hour for {c} hours. How far does she ride? Show your work.",
    "A shirt costs {a} dollars. It is reduced by {p} percent. What is the new price?",
    "What is {a} plus {c}, times {b}? Work it out step by step.",
    "What is {a0} divided by {b}?",
    "A rope is {a} metres long. It is cut into {b} equal pieces. How long is each piece?",
    "A box has {a} red balls and {c} blue balls. What fraction of the balls are red?",
    "A recipe needs {b} eggs for {c} people. How many eggs are needed for {d} people?",
    "Jo runs {b} km on Monday, {c} km on Wednesday and {d} km on Friday. How far does she run in the week?",
    "A square garden has sides of {b} metres. What is its area and its perimeter?",
    "There are {a} apples in a basket. A third of them are green. How many are green, if {a3} is the total?",
    "A movie starts at {h}:15 and lasts {m} minutes. When does it end?",
    "Leo is {b} years old. His father is {c} times as old. How old will his father be in {d} years?",
    "A phone plan costs {b} dollars a month plus {c} dollars to start. What does one year cost?",
    "If {b} notebooks cost {a} dollars, how much do {d} notebooks cost?",
    "A library has {a} books and buys {c} new ones each month. How many books will it have after {b} months?",
    "Mia scored {b}, {c} and {d} points in three games. What was her average score?",
    "A water tank loses {b} litres every hour. It starts with {a0} litres. How much is left after {c} hours?",
    "Write {a}/{a0} as a decimal and as a percentage.",
    "What is {p} percent of {a0}? Explain how you worked it out.",
    "A class of {a} children goes on a trip. Each minibus takes {b} children. How many minibuses are needed?",
    "Round {a0}.{c} to the nearest whole number and explain the rule.",
    "A train leaves at {h}:40 and arrives {m} minutes later. What time does it arrive?",
    "Two numbers add up to {a0} and one of them is {a}. What is the other?",
]
SMALL_TALK = [
    "Hi! How are you today?", "Good morning! Any ideas for a nice breakfast?", "I'm bored. Can you cheer me up?",
    "Tell me a joke.", "Tell me a joke about computers.", "What's your favourite book, and why?",
    "Can we just chat for a bit?", "I had a long day at work.", "What should I cook for dinner tonight?",
    "Do you like music?", "I just got a new puppy!", "It's my birthday today!", "I can't decide what to watch tonight.",
    "What's a fun fact I can share with my friends?", "Hello, who are you?", "What can you help me with?",
    "Thanks for your help earlier!", "I passed my driving test!", "I feel a bit lonely today.",
    "Recommend me a hobby I can start this weekend.", "What's a good name for a houseplant?",
    "Say something nice to start my day.", "I'm nervous about my presentation tomorrow.",
    "Tell me a riddle.", "Can you tell me a tongue twister?", "What's the best way to spend a lazy Sunday?",
    "I just finished reading a great novel.", "Describe your perfect day.", "Do you have a favourite animal?",
    "I'm learning to cook. Any easy recipes?", "Guess what? I got the job!", "I'm going to Italy next month!",
    "My friend is sad. What can I say to help?", "Write me a short motivational message.",
    "What would you do with a free afternoon?", "Tell me something interesting about space.",
    "I'm trying to drink more water. Any tips?", "Let's play a word game.", "What's a good question to start a conversation?",
    "I can't sleep. Talk to me about something calm.", "Can you recommend a board game for two people?",
    "I want to learn something new today. Surprise me.", "How was your day?", "Give me a compliment.",
    "What's the funniest animal in your opinion?", "Suggest a theme for a dinner party.",
    "Tell me a short, happy story.", "I'm planting flowers today!", "My team won the match last night!",
    "Do you think cats or dogs make better pets?", "What do you think about pineapple on pizza?",
]
ADVICE_SITUATIONS = [
    "I have too much homework and not enough time", "I want to eat healthier but I love sweets",
    "my roommate never does the dishes", "I get nervous when I speak in public", "I keep forgetting people's names",
    "I want to start saving money but I spend everything", "I can't stop checking my phone",
    "my friend and I had an argument", "I want to change careers at thirty-five", "I find it hard to wake up early",
    "I moved to a new town and don't know anyone", "I procrastinate on every big task", "my plants keep dying",
    "I want to read more books this year", "I feel tired every afternoon", "my neighbour's dog barks all night",
    "I have a job interview on Monday", "I want to learn to draw but I think I have no talent",
    "my child doesn't want to read", "I have to give negative feedback to a colleague",
    "I want to run a 5 km race in two months", "I spend too much time on video games",
    "I'm starting university next month", "I want to travel on a small budget", "my desk is always messy",
    "I have trouble saying no to people", "I want to write a novel but never finish anything",
    "I got a bad grade on a test", "I want to make my small shop better known", "I'm moving house next week",
]
ADVICE_FORMS = [
    "{s}. What should I do?", "Can you give me some advice? {s}.", "{s}. Any tips?",
    "What would you suggest? {s}.",
]
TERMS = [
    "democracy", "photosynthesis", "inflation", "metaphor", "algorithm", "ecosystem", "gravity", "empathy",
    "a budget", "an adjective", "a prime number", "a hypothesis", "a fraction", "a verb", "an atom", "biodiversity",
    "a noun", "irony", "a simile", "a paragraph", "a mammal", "a reptile", "a continent", "an island", "a peninsula",
    "erosion", "friction", "density", "velocity", "a molecule", "a calorie", "a vaccine", "an antibiotic",
    "a protein", "a carbohydrate", "nostalgia", "resilience", "procrastination", "mindfulness", "a haiku",
    "a sonnet", "a thesis", "a debate", "a recipe", "fermentation", "a spreadsheet", "a browser", "a server",
    "a password manager", "cloud storage", "a podcast", "a blog", "a startup", "an entrepreneur", "a mortgage",
    "interest rates", "a pension", "a stock", "a bond", "a currency", "a tariff", "a census", "a parliament",
    "a constitution", "a referendum", "a jury", "an alibi", "a galaxy", "a nebula", "a light year", "a black hole",
    "an orbit", "a tsunami", "a glacier", "a fjord", "a delta", "a canyon", "a savanna", "a tundra", "a monsoon",
    "humidity", "a thermometer", "a barometer", "an allergy", "a symptom", "a pulse", "a reflex", "a habit",
    "a routine", "a hobby", "a deadline", "feedback", "a compromise", "a stereotype", "a tradition", "folklore",
    "a proverb", "an idiom", "a synonym", "an antonym", "a palindrome", "an acronym", "sarcasm", "a pun",
]
DEFINE_FORMS = [
    "What does {t} mean?", "Define {t} in one sentence.", "What is {t}? Give an example.",
    "Explain the word \"{w}\" and use it in a sentence.",
]
FACT_QUESTIONS = [
    "Why do cats purr?", "How do bees make honey?", "Why is the ocean salty?", "How do birds know where to migrate?",
    "Why do we dream?", "How does a microwave oven heat food?", "Why do onions make you cry?",
    "How do fish breathe underwater?", "Why is grass green?", "How does a camera take a picture?",
    "Why do we get hiccups?", "How do plants drink water?", "Why does bread go stale?", "How do vaccines train the body?",
    "Why do stars twinkle?", "How does a bicycle stay upright?", "Why do some animals sleep all winter?",
    "How do hot air balloons fly?", "Why do we yawn?", "How does soap clean our hands?", "Why does ice float?",
    "How do ants find food?", "Why do we need to drink water?", "How does the internet send a message?",
    "Why do metals feel cold?", "How do volcanoes erupt?", "Why is the Dead Sea so salty?",
    "How does a battery store energy?", "Why do zebras have stripes?", "How do submarines dive and rise?",
    "Why is the Moon sometimes visible during the day?", "How do chameleons change colour?",
    "Why do we have fingerprints?", "How does a thermometer work?", "Why do our ears pop on a mountain?",
    "How is chocolate made?", "How is paper made?", "How is glass made?", "How do elevators work?",
    "How does a lock and key work?", "How does an electric guitar make sound?", "Why does popcorn pop?",
    "How do bats find their way in the dark?", "Why is the Pacific Ocean called pacific?",
    "What makes a rainbow appear after rain?", "How do earthworms help the soil?", "Why do we blush?",
    "How do traffic lights know when to change?", "Why does the Moon have craters?", "How do owls see at night?",
]
OPINION = [
    "Is it better to read the book before watching the film? Give both sides.",
    "Should homework be banned in primary schools? Discuss.", "Are video games good or bad for children?",
    "Is it worth learning to write by hand in the age of computers?", "Should cities ban cars from their centres?",
    "Is it better to have a few close friends or many acquaintances?", "Should everyone learn to cook?",
    "What are the pros and cons of school uniforms?", "Is social media good for society?",
    "Is it better to rent or buy a car?", "Should museums be free?", "Is it important to learn history?",
    "What makes a good teacher?", "What makes a city a nice place to live?", "Why do people enjoy scary films?",
    "Is breakfast really the most important meal of the day?", "What are the benefits of learning music?",
    "Should children have pocket money?", "Is working four days a week a good idea?",
    "What makes a good story?",
]
CLASSIFY = [
    ("Is this review positive or negative? \"{x}\"", [
        "The food was cold and the waiter ignored us.", "Best holiday ever, the staff were lovely!",
        "It works, but the battery dies too quickly.", "I would buy this again without thinking twice.",
        "The film was far too long and the ending made no sense.", "Friendly service and fair prices.",
        "The package arrived broken and nobody answered my emails.", "Comfortable shoes, I wear them every day.",
    ]),
    ("Which category does this belong to: sport, politics, science or entertainment? \"{x}\"", [
        "The team won the cup after a penalty shoot-out.", "Researchers found water ice in a crater.",
        "The new film broke box office records.", "Parliament passed the new budget on Friday.",
        "A new species of frog was found in the rainforest.", "The singer announced a world tour.",
    ]),
    ("Extract the names of people and places from this sentence: \"{x}\"", [
        "Anna flew from Madrid to Oslo to visit her cousin Peter.",
        "In Cairo, Omar met his old teacher Mrs Lewis.", "Kenji and Laura walked along the river in Prague.",
    ]),
]


def _pick(rng: random.Random, items: list, k: int) -> list:
    return rng.sample(items, min(k, len(items)))


def _tagged(task: str, prompts) -> list[tuple[str, str]]:
    return [(task, p) for p in prompts]


def wide_prompts(seed: int = 0) -> list[dict[str, str]]:
    """Distinct prompts as {"prompt", "task"} dicts, deterministic for a seed, held-out checked."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for t in TOPICS:
        out += _tagged("explain", [f.format(t=t) for f in _pick(rng, EXPLAIN, 5)])
    out += _tagged("howto", [f.format(h=h) for h in HOWTO for f in _pick(rng, HOWTO_FORMS, 3)])
    out += _tagged("list", [f.format(s=s) for s in LIST_SUBJECTS for f in _pick(rng, LIST_FORMS, 2)])
    out += _tagged("compare", [f.format(a=a, b=b) for a, b in COMPARE for f in _pick(rng, COMPARE_FORMS, 2)])
    stories = list(itertools.product(STORY_FORMS, CHARACTERS, SETTINGS))
    out += _tagged("story", [f.format(c=c, s=s) for f, c, s in _pick(rng, stories, 480)])
    poems = list(itertools.product(POEM_FORMS, POEM_SUBJECTS))
    out += _tagged("poem", [f.format(p=p) for f, p in _pick(rng, poems, 240)])
    out += _tagged("email", [f.format(e=e) for e in EMAIL_PURPOSES for f in _pick(rng, EMAIL_FORMS, 3)])
    out += _tagged("summary", [f.format(x=x) for x in PASSAGES for f in _pick(rng, PASSAGE_TASKS, 6)])
    out += _tagged("rewrite", [f.format(x=x) for x in SENTENCES for f in _pick(rng, SENTENCE_TASKS, 3)])
    out += _tagged("code", [f.format(c=c) for c in CODE_TASKS for f in _pick(rng, CODE_FORMS, 3)])
    out += _tagged("code", CODE_QUESTIONS)
    for tpl in MATH_TEMPLATES:
        for _ in range(12):
            b, c, d = rng.randint(2, 12), rng.randint(2, 9), rng.randint(3, 20)
            a = rng.randint(10, 99)
            out.append(("math", tpl.format(a=a, b=b, c=c, d=d, a0=a * b, a3=3 * a, p=rng.choice([10, 15, 20, 25, 30, 40, 50]),
                                           h=rng.randint(1, 11), m=rng.choice([45, 70, 85, 95, 110, 125, 140]))))
    out += _tagged("chat", SMALL_TALK)
    out += _tagged("advice", [f.format(s=s[0].upper() + s[1:]) for s in ADVICE_SITUATIONS
                              for f in _pick(rng, ADVICE_FORMS, 3)])
    for t in TERMS:
        w = t.split(" ", 1)[1] if t.startswith(("a ", "an ")) else t
        out += _tagged("define", [f.format(t=t, w=w) for f in _pick(rng, DEFINE_FORMS, 2)])
    out += _tagged("qa", FACT_QUESTIONS)
    for q in FACT_QUESTIONS:
        out.append(("qa", f"{q} Explain it simply."))
    out += _tagged("opinion", OPINION)
    for form, items in CLASSIFY:
        out += _tagged("classify", [form.format(x=x) for x in items])
    out += _tagged("v1", training_prompts())
    seen, prompts = set(), []
    for task, p in out:
        if p not in seen:
            seen.add(p)
            prompts.append({"prompt": p, "task": task})
    assert_no_held_out([p["prompt"] for p in prompts])
    return prompts


if __name__ == "__main__":
    from collections import Counter

    ps = wide_prompts()
    print(len(ps), "distinct prompts;", dict(Counter(p["task"] for p in ps)))
    for p in random.Random(1).sample(ps, 12):
        print(" ", p["task"], "|", p["prompt"][:110].replace("\n", " "))
