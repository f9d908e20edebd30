"""Which glossary entries apply to a sentence: case- and inflection-tolerant matching of source terms."""
from nmt_serve.text.glossary import MAX_ENTRIES, GlossaryEntry, Terminology, applicable, check, occurs, words


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

