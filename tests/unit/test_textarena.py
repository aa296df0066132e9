"""The TextArena adapter (rlvr.envs.textarena) on real textarena 0.7.4 games, every value worked out by hand from the
games' rules: Rock-Paper-Scissors against fixed opponents (win/draw/loss onto [0, 1], invalid moves and TextArena's
error allowance), GuessTheNumber's seeded secret and partial reward, the same game whichever process steps it,
rows, and the refusals at load."""

from __future__ import annotations

import pickle
import random

import pytest

pytest.importorskip("textarena")

from rlvr.envs.base import EnvStep  # noqa: E402
from rlvr.envs.textarena import TextArena, TextArenaError  # noqa: E402

RPS = {"game": "IteratedRockPaperScissors-v0", "game_args": {"num_rounds": 1}, "players": 2}


def play(env: TextArena, moves: list[str], *, repickle: bool = True) -> list[EnvStep]:
    out = []
    for m in moves:
        if repickle:  # as rlvr does between calls
            env = pickle.loads(pickle.dumps(env))
        out.append(env.step([], {"role": "assistant", "content": m}))
        if out[-1].done:
            break
    return out


@pytest.mark.parametrize(("move", "reward", "game_reward"),
                         [("[scissors]", 1.0, 1.0), ("[paper]", 0.5, 0.0), ("I pick [rock] today", 0.0, -1.0)])
def test_one_round_against_paper_maps_win_draw_loss_onto_0_1(move, reward, game_reward):
    env = TextArena(**RPS, opponent="always:[paper]")
    (opening,) = env.reset({"seed": 3})
    assert opening["role"] == "user" and "Rock-Paper-Scissors" in opening["content"]
    (last,) = play(env, [move])
    assert (last.done, last.reward, last.info["game_reward"], last.info["invalid_moves"]) == \
        (True, reward, game_reward, 0)


def test_an_invalid_move_gets_the_games_message_then_one_more_try_then_loses():
    env = TextArena(**RPS, opponent="always:[paper]")
    env.reset({"seed": 3})
    first, second = play(env, ["hello", "still no move"])
    assert not first.done and first.reward is None and first.info["invalid_moves"] == 1
    assert "attempted an invalid move" in first.messages[0]["content"]
    assert "Move not recognized" in first.messages[0]["content"]
    assert (second.done, second.reward, second.info["invalid_moves"]) == (True, 0.0, 2)  # error allowance 1


def test_a_valid_move_after_an_invalid_one_still_counts():
    env = TextArena(**RPS, opponent="always:[paper]")
    env.reset({"seed": 3})
    first, second = play(env, ["???", "[s]"])
    assert (second.done, second.reward, second.info["invalid_moves"], second.info["moves"]) == (True, 1.0, 1, 2)


def test_a_random_opponent_draws_from_the_rows_seed_the_same_in_any_process():
    def outcomes(seed):
        env = TextArena(**{**RPS, "game_args": {"num_rounds": 5}}, opponent="random:[rock]|[paper]|[scissors]")
        env.reset({"seed": seed})
        return [s.messages[0]["content"] if s.messages else s.info["reason"]
                for s in play(env, ["[rock]"] * 5)]  # fmt: skip

    assert outcomes(11) == outcomes(11)
    assert outcomes(11) != outcomes(12) or outcomes(11) != outcomes(13)
    # the global generator of the process is left as it was
    random.seed(0)
    before = random.random()
    random.seed(0)
    outcomes(11)
    assert random.random() == before


def test_guess_the_number_is_seeded_and_scores_the_last_guesss_closeness():
    args = {"game": "GuessTheNumber-v0", "game_args": {"min_number": 1, "max_number": 8, "max_turns": 2},
            "reward_range": [0, 1]}
    env = TextArena(**args)
    env.reset({"seed": 1})
    secret = env.env.game_number
    again = TextArena(**args)
    again.reset({"seed": 1})
    assert again.env.game_number == secret  # the row's seed decides the secret
    wrong = 8 if secret != 8 else 1
    other = 1 if secret not in (1, 8) else 4
    steps = play(env, [f"[{wrong}]", f"[{other}]", f"[{secret}]"])
    assert steps[0].messages[0]["content"] == ("The target number is lower." if wrong > secret else
                                               "The target number is higher.")
    # GuessTheNumber-v0 ends at its turn limit with 1 - |last guess - secret| / (max - min)
    want = 1 - abs(other - secret) / 7 if steps[-1].info["moves"] == 3 and steps[-1].reward != 1.0 else 1.0
    assert steps[-1].done and steps[-1].reward == pytest.approx(want)


def test_the_model_can_play_the_second_seat():
    env = TextArena(**RPS, seat=1, opponent="always:[rock]")
    (opening,) = env.reset({"seed": 3})  # the opponent (seat 0) moved first
    assert "Player 1" in opening["content"]
    (last,) = play(env, ["[paper]"])
    assert (last.done, last.reward) == (True, 1.0)


def test_an_opponent_that_answers_no_move_is_an_error_not_a_loss(tmp_path):
    f = tmp_path / "opp.py"
    f.write_text("def silent(observation):\n    return None\n")
    env = TextArena(**RPS, opponent=f"{f}:silent")
    env.reset({"seed": 3})
    with pytest.raises(TextArenaError, match="answered None, not a move"):
        play(env, ["[rock]"])


def test_rows_are_seeds_the_same_for_the_same_seed():
    a, b, c = TextArena.rows(size=4, seed=1), TextArena.rows(size=4, seed=1), TextArena.rows(size=4, seed=2)
    assert a == b and a != c and all(r["question"] == "" and isinstance(r["seed"], int) for r in a)
    assert len({r["seed"] for r in a}) == 4


@pytest.mark.parametrize(("args", "match"), [
    ({"game": "TicTacToo-v0"}, "did you mean TicTacToe-v0"),
    ({"game": "Wordle-v0"}, "needs nltk data"),
    ({"game": "TicTacToe-v0", "players": 2, "opponent": "random:"}, "lists no moves"),
    ({"game": "TicTacToe-v0", "players": 1}, "did not reset"),
])
def test_check_args_refuses_at_load_with_the_reason(args, match):
    with pytest.raises(ValueError, match=match):
        TextArena.check_args(**args)


def test_a_two_player_game_needs_an_opponent():
    with pytest.raises(ValueError, match="needs opponent"):
        TextArena(game="TicTacToe-v0", players=2)
