"""Which glossary entries apply to a sentence: case- and inflection-tolerant matching of source terms."""
from nmt_serve.text.glossary import MAX_ENTRIES, GlossaryEntry, GlossaryIndex, Terminology, applicable, check, occurs, words


def test_terms_match_case_insensitively_and_through_endings():
    sentence = words("Zwei HUNDE spielen mit den Hundes Bällen im Schneemann.")
    assert occurs("Hund", sentence) and occurs("spielen", sentence)
    assert not occurs("Schnee", sentence)  # "Schneemann" adds more than an ending
    assert not occurs("Katze", sentence)
    assert occurs("mit den", sentence) and not occurs("den mit", sentence)


def test_applicable_entries_in_glossary_order_each_target_once():
    entries = [GlossaryEntry("Hund", "canine"), GlossaryEntry("Katze", "feline"), GlossaryEntry("Hunde", "canine"),
               GlossaryEntry("Park", "garden")]
    assert applicable("Zwei Hunde im Park.", entries) == ["canine", "garden"]
    assert Terminology(tuple(entries)).terms_for(["Ein Park.", "Nichts."]) == [["garden"], []]
    assert Terminology().terms_for(["Ein Park."]) is None


def test_unusable_glossaries_say_why():
    assert check([GlossaryEntry("Hund", "dog")], []) is None
    assert "at most" in check([GlossaryEntry("Hund", "dog")] * (MAX_ENTRIES + 1), [])[0]
    assert check([GlossaryEntry("...", "dog")], []) is not None  # no word to match
    assert check([], ["  "])[1] == "avoid"
    assert check([GlossaryEntry("...", "dog")], [])[1] == "glossary"
    # one source term (up to case), two targets: refused; the same pair twice is harmless
    assert "two target terms" in check([GlossaryEntry("Hund", "dog"), GlossaryEntry("hund", "hound")], [])[0]
    assert check([GlossaryEntry("Hund", "dog"), GlossaryEntry("Hund", "dog")], []) is None


def test_an_ending_is_an_ending_and_the_longest_term_wins():
    hund = GlossaryEntry("Hund", "doggo")
    assert applicable("Hundert Männer laufen.", [hund]) == []  # "ert" is no ending
    assert applicable("Zwei Hunden und ein Hundes.", [hund]) == ["doggo"]
    red = GlossaryEntry("roter Hund", "red hound")
    assert applicable("Ein roter Hund rennt.", [hund, red]) == ["red hound"]
    assert applicable("Ein roter Hund und ein Hund.", [hund, red]) == ["doggo", "red hound"]  # the second stands alone



def test_the_index_by_first_word_finds_what_a_scan_of_every_entry_finds():
    import random
    from pathlib import Path

    lines = (Path(__file__).resolve().parent.parent / "fixtures" / "train300.de").read_text().splitlines()
    vocabulary = sorted({w.strip(".,!?\"") for line in lines for w in line.split()} - {""})
    rng = random.Random(0)
    entries, seen = [], set()
    for k in range(3000):  # terms of one and two words, some as stems the sentences inflect ("Hund" for "Hunde")
        term = " ".join(rng.sample(vocabulary, rng.choice([1, 1, 2])))
        term = term[:-1] if rng.random() < 0.2 and len(term) > 4 else term
        if term.casefold() not in seen:
            seen.add(term.casefold())
            entries.append(GlossaryEntry(term, f"T{k}"))
    index = GlossaryIndex(entries)
    found = [index.applicable(line) for line in lines[:150]]
    assert found == [applicable(line, entries) for line in lines[:150]]
    assert sum(map(len, found)) > 300  # many terms apply: the comparison means something
