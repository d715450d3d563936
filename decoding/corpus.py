"""The embedded default corpus: generated deterministically from a seed, no download needed.

* public: general narrative English (people, places, weather, work, animals) from a small
  probabilistic grammar; the public model is trained on it.
* private: airline customer-service dialogues (like the AdaPMixED paper's Air Dialogue set) with
  names, cities, dates, times and booking codes, in a format and domain the public text never
  shows. It is split into N disjoint teacher shards and a held-out evaluation part.
* canaries: a few records with a unique secret (a booking code and a passport number) planted,
  repeated, in known shards, for the audits to look for.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field

NAMES = ["Alice", "Bruno", "Chen", "Dana", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kofi", "Lena", "Mateo",
         "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wei", "Yara", "Zoe", "Marta",
         "Peter", "Sofia", "Liam", "Emma", "Noah", "Mia", "Ivan", "Aiko", "Pablo", "Lucia"]
SURNAMES = ["Smith", "Garcia", "Novak", "Okafor", "Tanaka", "Muller", "Rossi", "Silva", "Kim", "Dubois", "Haddad",
            "Jensen", "Kowalski", "Moreau", "Nguyen", "Patel", "Schmidt", "Torres", "Walker", "Yilmaz"]
CITIES = ["Boston", "Denver", "Chicago", "Seattle", "Austin", "Miami", "Dallas", "Atlanta", "Phoenix", "Portland",
          "Houston", "Detroit", "Orlando", "Nashville", "Toronto", "London", "Paris", "Berlin", "Madrid", "Rome",
          "Lisbon", "Dublin", "Vienna", "Prague", "Oslo", "Tokyo", "Seoul", "Sydney", "Lima", "Cairo"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

_PUBLIC_NOUNS = ["river", "garden", "market", "library", "mountain", "village", "harbor", "forest", "bridge", "school",
                 "kitchen", "station", "museum", "field", "castle", "island", "road", "house", "shop", "park"]
_PUBLIC_ANIMALS = ["dog", "cat", "horse", "fox", "owl", "goat", "rabbit", "crow", "bear", "deer"]
_PUBLIC_ADJECTIVES = ["quiet", "old", "bright", "small", "green", "cold", "busy", "warm", "tall", "gentle", "dark",
                      "empty", "golden", "narrow", "wide"]
_PUBLIC_VERBS = ["walked to", "looked at", "painted", "visited", "cleaned", "found", "remembered", "left", "built",
                 "watched"]
_PUBLIC_WEATHER = ["rain fell softly", "the wind was strong", "the sun came out", "snow covered the roofs",
                   "fog rolled in", "the sky turned grey", "a storm was coming"]
_PUBLIC_TEMPLATES = [
    "{name} {verb} the {adj} {noun} in the morning.",
    "In {month}, {name} and {name2} travelled to {city} to see the {noun}.",
    "The {animal} slept near the {adj} {noun} while {weather}.",
    "Every {weekday}, {name} reads a book about the {noun} of {city}.",
    "When {weather}, the people of the {noun} stayed inside and told stories.",
    "{name} said that the {noun} was {adj} and {adj2}.",
    "There was a {adj} {animal} that lived by the {noun}.",
    "The {noun} in {city} is older than the {noun2}.",
    "After dinner, {name} wrote a letter to {name2} about the {adj} {noun}.",
    "On {weekday}, {weather}, so {name} {verb} the {noun2}.",
    "{name} {surname} works at the {noun} near the {adj} {noun2}.",
    "The children asked {name} why the {animal} was so {adj}.",
    "Long ago a {adj} {noun} stood where the {noun2} is now.",
    "{name} had never seen a {animal} as {adj} as that one.",
]

_GREETINGS = ["Hi", "Hello", "Good morning", "Good afternoon", "Hey there"]

# Public service dialogues (restaurant, hotel, library, shop): the turn format, names, dates and
# numbers carry over to the private domain; flights, booking codes, gates and "Agent:" do not.
_PUBLIC_DIALOGUE_ROLES = ["Waiter", "Clerk", "Librarian", "Host", "Staff"]
_PUBLIC_DIALOGUE_REQUESTS = [
    "I would like a table for {count} on {date} at {time}.",
    "I need a room in {city} for {count} nights from {date}.",
    "I want to return a book about the {noun} that I borrowed on {date}.",
    "do you have the {adj} coat in a larger size?",
    "can I change my reservation to {weekday}?",
    "I would like to order the soup and some bread.",
]
_PUBLIC_DIALOGUE_ANSWERS = [
    "Of course, {name}. Your table is ready at {time} on {date}.",
    "Certainly. Your room number is {number} and breakfast is at {time}.",
    "Thank you, {name}. The book is returned and there is no fee.",
    "Sure, the {adj} coat costs {price} dollars.",
    "No problem, {name}. I moved your reservation to {weekday} at {time}.",
    "Good choice. The soup of the day is made with {adj} vegetables.",
]
_PUBLIC_DIALOGUE_FOLLOWUPS = ["Thank you very much.", "That sounds good.", "How much is it?", "Can I pay by card?",
                              "Is it far from the {noun}?", "Great, see you then."]
_PUBLIC_DIALOGUE_CLOSERS = ["It is {price} dollars, {name}.", "Yes, it is near the {noun} in {city}.",
                            "You are welcome. Have a nice {weekday}.", "Yes, we take cards. Enjoy your day."]
_REQUESTS = [
    "I need to change my flight from {from_city} to {to_city} on {date}.",
    "I would like to book a flight from {from_city} to {to_city} on {date}.",
    "I want to cancel my trip to {to_city} on {date}.",
    "can you check the status of my flight to {to_city}?",
    "I need an extra bag on my flight from {from_city} on {date}.",
    "I would like a window seat on my flight to {to_city}.",
]
_AGENT_OPENERS = ["Sure, {name}.", "Of course, {name}.", "Certainly, {name}.", "No problem, {name}."]
_AGENT_ACTIONS = [
    "Your booking code is {code}. I can move you to the {time} flight on {date2}.",
    "I found a seat on the {time} flight from {from_city} to {to_city}. Your booking code is {code}.",
    "Your booking {code} is cancelled and the refund of {price} dollars goes back to your card.",
    "The flight to {to_city} with booking {code} leaves at {time} from gate {gate}.",
    "I added one bag to booking {code} for {price} dollars.",
    "I moved you to seat {seat} on booking {code}.",
]
_CUSTOMER_FOLLOWUPS = ["Thank you, that works.", "Great, thanks for your help.", "Can I get an aisle seat instead?",
                       "How much will that cost?", "Is there an earlier flight?", "Perfect, please send the ticket."]
_AGENT_CLOSERS = ["You are all set, {name}. Have a nice trip to {to_city}.", "The ticket is in your email. Safe travels.",
                  "The change fee is {price} dollars. Anything else?", "The {time2} flight has one seat left. Shall I book it?",
                  "Done. Your new booking code is {code2}."]

CANARY_TEMPLATE = ("Customer: Hi, I am {name} {surname}. My passport number is {passport} and my secret booking code is "
                   "{code}.\nAgent: Thank you, {name}. I have saved passport {passport} to booking {code}.")


@dataclass(frozen=True)
class Canary:
    """A secret planted in one private shard: its teacher (`shard`), the record's text, the secret
    (a booking code) the audit's extraction test looks for, and how many times it was planted."""

    shard: int
    text: str
    secret: str
    repetitions: int


@dataclass(frozen=True)
class EmbeddedCorpus:
    """Public text, N disjoint private shards, held-out private text, and the planted canaries."""

    seed: int
    public_train: str
    public_heldout: str
    shards: tuple[str, ...]
    private_heldout: str
    canaries: tuple[Canary, ...] = field(default_factory=tuple)

    def content_hash(self) -> str:
        """The corpus's identity: every part's text and the canaries.

        Returns:
            sha256 (64 hex digits) over the sha256 of each text part, in order, and the canaries' JSON.
        """
        digest = hashlib.sha256()
        for part in (self.public_train, self.public_heldout, *self.shards, self.private_heldout):
            digest.update(hashlib.sha256(part.encode()).digest())
        digest.update(json.dumps([c.__dict__ for c in self.canaries], sort_keys=True).encode())
        return digest.hexdigest()


def _booking_code(rng: random.Random) -> str:
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    return "".join(rng.choice(letters) for _ in range(3)) + str(rng.randint(100, 999))


def _date(rng: random.Random) -> str:
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(5, 22)}:{rng.choice(['00', '15', '30', '45'])}"


def public_sentence(rng: random.Random) -> str:
    """One public sentence from a template, its slots filled at random.

    Args:
        rng: the corpus's random generator (advanced).

    Returns:
        The sentence.
    """
    template = rng.choice(_PUBLIC_TEMPLATES)
    name, name2 = rng.sample(NAMES, 2)
    noun, noun2 = rng.sample(_PUBLIC_NOUNS, 2)
    adj, adj2 = rng.sample(_PUBLIC_ADJECTIVES, 2)
    return template.format(name=name, name2=name2, surname=rng.choice(SURNAMES), verb=rng.choice(_PUBLIC_VERBS),
                           noun=noun, noun2=noun2, adj=adj, adj2=adj2, animal=rng.choice(_PUBLIC_ANIMALS),
                           city=rng.choice(CITIES), month=rng.choice(MONTHS), weekday=rng.choice(WEEKDAYS),
                           weather=rng.choice(_PUBLIC_WEATHER))


def public_paragraph(rng: random.Random) -> str:
    """A public paragraph: 3 to 7 public sentences.

    Args:
        rng: the corpus's random generator (advanced).

    Returns:
        The sentences joined by spaces.
    """
    return " ".join(public_sentence(rng) for _ in range(rng.randint(3, 7)))


def public_dialogue(rng: random.Random) -> str:
    """One public service dialogue (not airline: that domain is private).

    Args:
        rng: the corpus's random generator (advanced).

    Returns:
        2 to 6 turns, one per line, alternating customer and service role.
    """
    role = rng.choice(_PUBLIC_DIALOGUE_ROLES)
    values = dict(name=rng.choice(NAMES), count=rng.randint(2, 8), date=_date(rng), time=_time(rng),
                  city=rng.choice(CITIES), noun=rng.choice(_PUBLIC_NOUNS), adj=rng.choice(_PUBLIC_ADJECTIVES),
                  weekday=rng.choice(WEEKDAYS), number=rng.randint(100, 999), price=rng.choice(range(5, 300, 5)))
    turns = [f"Customer: {rng.choice(_GREETINGS)}, I am {values['name']}. "
             + rng.choice(_PUBLIC_DIALOGUE_REQUESTS).format(**values),
             f"{role}: " + rng.choice(_PUBLIC_DIALOGUE_ANSWERS).format(**values)]
    for _ in range(rng.randint(0, 2)):
        turns.append("Customer: " + rng.choice(_PUBLIC_DIALOGUE_FOLLOWUPS).format(**values))
        turns.append(f"{role}: " + rng.choice(_PUBLIC_DIALOGUE_CLOSERS).format(**values))
    return "\n".join(turns)


def dialogue(rng: random.Random) -> str:
    """One customer-service dialogue record.

    Args:
        rng: the corpus's random generator (advanced).

    Returns:
        2 to 6 turns between a customer and an airline agent, one per line: a private record.
    """
    name = rng.choice(NAMES)
    from_city, to_city = rng.sample(CITIES, 2)
    values = dict(name=name, from_city=from_city, to_city=to_city, date=_date(rng), date2=_date(rng), time=_time(rng),
                  time2=_time(rng), code=_booking_code(rng), code2=_booking_code(rng), price=rng.choice(range(25, 400, 5)),
                  gate=f"{rng.choice('ABCDE')}{rng.randint(1, 40)}", seat=f"{rng.randint(1, 40)}{rng.choice('ABCDEF')}")
    turns = [f"Customer: {rng.choice(_GREETINGS)}, I am {name}. " + rng.choice(_REQUESTS).format(**values),
             "Agent: " + rng.choice(_AGENT_OPENERS).format(**values) + " " + rng.choice(_AGENT_ACTIONS).format(**values)]
    for _ in range(rng.randint(0, 2)):
        turns.append("Customer: " + rng.choice(_CUSTOMER_FOLLOWUPS))
        turns.append("Agent: " + rng.choice(_AGENT_CLOSERS).format(**values))
    return "\n".join(turns)


def make_canaries(rng: random.Random, teachers: int, count: int, repetitions: int) -> tuple[Canary, ...]:
    """Canaries for the private shards: canary i goes to shard (3i + 1) mod N.

    Args:
        rng: the corpus's random generator (advanced).
        teachers: the number of shards N.
        count: how many canaries (at most N are made).
        repetitions: how many times each is planted in its shard.

    Returns:
        min(count, N) canaries, each with a random passport number and secret booking code.
    """
    canaries = []
    for index in range(min(count, teachers)):
        shard = (index * 3 + 1) % teachers
        code = "ZQ" + "".join(rng.choice("XKVW") for _ in range(2)) + str(rng.randint(1000, 9999))
        passport = f"P{rng.randint(10_000_000, 99_999_999)}"
        text = CANARY_TEMPLATE.format(name=rng.choice(NAMES), surname=rng.choice(SURNAMES), passport=passport, code=code)
        canaries.append(Canary(shard=shard, text=text, secret=code, repetitions=repetitions))
    return tuple(canaries)


def generate_corpus(seed: int = 0, teachers: int = 8, public_paragraphs: int = 6000, dialogues_per_shard: int = 300,
                    heldout_dialogues: int = 400, canaries: int = 2, canary_repetitions: int = 20) -> EmbeddedCorpus:
    """The embedded default corpus; the same arguments always give the same text.

    Args:
        seed: the random seed.
        teachers: the number of private shards N (>= 1).
        public_paragraphs: public paragraphs and dialogues drawn (95% train, 5% held out).
        dialogues_per_shard: private dialogue records per shard.
        heldout_dialogues: private held-out records (the teacher-forced default text).
        canaries: canaries planted (at most N).
        canary_repetitions: times each canary is planted in its shard.

    Returns:
        The corpus: public train and held-out text, N shards of blank-line separated records,
        the private held-out text and the canaries.

    Raises:
        ValueError: if `teachers` < 1.
    """
    if teachers < 1:
        raise ValueError(f"teachers must be an integer >= 1, got {teachers}")
    rng = random.Random(seed)
    public = [public_dialogue(rng) if rng.random() < 0.4 else public_paragraph(rng) for _ in range(public_paragraphs)]
    split = int(0.95 * len(public))
    planted = make_canaries(rng, teachers, canaries, canary_repetitions)
    shards = []
    for shard in range(teachers):
        records = [dialogue(rng) for _ in range(dialogues_per_shard)]
        for canary in planted:
            if canary.shard == shard:
                records.extend([canary.text] * canary.repetitions)
        rng.shuffle(records)
        shards.append("\n\n".join(records))
    heldout = "\n\n".join(dialogue(rng) for _ in range(heldout_dialogues))
    return EmbeddedCorpus(seed=seed, public_train="\n\n".join(public[:split]), public_heldout="\n\n".join(public[split:]),
                          shards=tuple(shards), private_heldout=heldout, canaries=planted)
