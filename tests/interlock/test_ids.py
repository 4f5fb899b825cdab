"""`new_id()`: random ids in the form `str(uuid.uuid4())` gives."""

import uuid

from interlock._ids import new_id


def test_ids_are_random_version_4_uuids_in_their_usual_form() -> None:
    ids = [new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text  # lower case, dashes where uuid puts them
    # every bit that is not the version's or the variant's takes both values
    bits = [int(uuid.UUID(text)) for text in ids]
    fixed = {bit for bit in range(128) if len({(b >> bit) & 1 for b in bits}) == 1}
    assert fixed == {76, 77, 78, 79, 62, 63}
