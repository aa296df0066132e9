"""The TextArena adapter (rlvr.envs.textarena) on real textarena 0.7.4 games, every value worked out by hand from the
games' rules: Rock-Paper-Scissors against fixed opponents (win/draw/loss onto [0, 1], invalid moves and TextArena's
error allowance), GuessTheNumber's seeded secret and partial reward, the same game whichever process steps it,
rows, and the refusals at load."""

from __future__ import annotations

import pickle
import random

import pytest

pytest.importorskip("textarena")

from rlvr.envs.base import BadEnvOutput, EnvStep, check_step  # noqa: E402
from rlvr.envs.textarena import TextArena, TextArenaError  # noqa: E402

RPS = {"game": "IteratedRockPaperScissors-v0", "game_args": {"num_rounds": 1}, "players": 2}


def play(env: TextArena, moves: list[str], *, repickle: bool = True) -> list[EnvStep]:
    out = []
    for m in moves:
        if repickle:  # as rlvr does between calls
            env = pickle.loads(pickle.dumps(env))
        out.append(check_step(env.step([], {"role": "assistant", "content": m})))  # what rlvr accepts
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
    assert last.info["reason"] == {1.0: "Player 0 won the most rounds!", 0.5: "The match is a draw!",
                                   0.0: "Player 1 won the most rounds!"}[reward]


def test_an_invalid_move_gets_the_games_message_then_one_more_try_then_loses():
    env = TextArena(**RPS, opponent="always:[paper]")
    env.reset({"seed": 3})
    first, second = play(env, ["hello", "still no move"])
    assert not first.done and first.reward is None and first.info == {"invalid_moves": 1, "moves": 1}
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
    assert steps[-1].info["invalid_moves"] == 0 and steps[-1].info["moves"] == len(steps)  # ended by a valid move


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


def test_the_opponents_move_is_shown_as_its_and_the_models_own_echo_is_left_out():
    env = TextArena(game="TicTacToe-v0", players=2, opponent="always:[4]", system_prompt="Play well.")
    system, user = env.reset({"seed": 1})
    assert system == {"role": "system", "content": "Play well."} and user["role"] == "user"
    assert "Available Moves: '[0]', '[1]'" in user["content"]
    (step,) = play(env, ["[0]"])
    lines = step.messages[0]["content"].split("\n")
    assert lines[0] == "Player 0 placed their symbol (O) in cell 0."  # the game's account of the model's move
    assert "[0]" not in lines  # the model's own reply is not echoed back
    assert "[Player 1] [4]" in lines and "Player 1 placed their symbol (X) in cell 4." in lines


def test_a_game_that_draws_during_play_is_the_same_whatever_the_process_did_between_steps():
    def hands(noise: bool):
        env = TextArena(game="Blackjack-v0", game_args={"num_hands": 3})
        seen = [env.reset({"seed": 4})[0]["content"]]
        for _ in range(6):
            if noise:  # another trajectory's game in the same worker, between this one's steps
                random.seed(12345)
                random.random()
            env = pickle.loads(pickle.dumps(env))
            step = env.step([], {"role": "assistant", "content": "[Hit]"})
            seen.append(step.messages[0]["content"] if step.messages else step.info["reason"])
            if step.done:
                break
        return seen

    assert hands(noise=False) == hands(noise=True)


def test_a_game_of_your_own_is_imported_again_where_it_is_unpickled():
    import sys

    game = "tests/unit/conformance_envs.py:ArenaGame"
    env = TextArena(game=game, reward_range=[-1, 1])
    env.reset({"seed": 2})
    blob = pickle.dumps(env)
    for name in [n for n, m in sys.modules.items() if getattr(m, "__file__", "") and
                 m.__file__.endswith("conformance_envs.py") and n.startswith("rlvr_user")]:  # fmt: skip
        del sys.modules[name]  # a worker that never made this game
    (last,) = play(pickle.loads(blob), ["[7]"], repickle=False)
    assert (last.done, last.reward) == (True, 1.0)


def test_not_a_game_is_refused():
    with pytest.raises(ValueError, match="is not a textarena.Env subclass"):
        TextArena(game="tests/unit/test_textarena.py:play").reset({"seed": 1})


def test_a_raw_id_is_taken_as_it_is():
    env = TextArena(**{**RPS, "game": "IteratedRockPaperScissors-v0-raw"}, opponent="always:[paper]")
    env.reset({"seed": 1})
    assert play(env, ["[s]"])[-1].reward == 1.0


class _Ended:
    """A finished game whose close() gives ``rewards`` and ``game_info``."""

    def __init__(self, rewards, game_info):
        self.rewards, self.game_info = rewards, game_info

    def close(self):
        return self.rewards, self.game_info


@pytest.mark.parametrize(("rewards", "game_info", "want"), [
    ({}, {}, 0.0),  # no reward for the seat: the low end (a loss), not a win
    (None, None, 0.0),
    ({0: 5}, {0: {"reason": "big"}}, 1.0),  # clipped into [0, 1]
    ({0: -3}, {}, 0.0),
    ({0: 0.5}, {0: {"reason": "half"}}, 0.75),
])
def test_the_end_maps_the_seats_reward(rewards, game_info, want):
    env = TextArena(game="GuessTheNumber-v0")
    env.env = _Ended(rewards, game_info)
    end = env._end()
    assert (end.done, end.reward, end.messages) == (True, want, [])
    assert end.info["reason"] == ((game_info or {}).get(0) or {}).get("reason", "")


@pytest.mark.parametrize("bad", ["a lot", True, None])
def test_a_reward_that_is_not_a_number_is_bad_output(bad):
    env = TextArena(game="GuessTheNumber-v0")
    env.env = _Ended({0: bad}, {})
    with pytest.raises(BadEnvOutput, match="not a number"):
        env._end()


@pytest.mark.parametrize(("kwargs", "match"), [({"players": 1, "seat": 1}, "seat=1"),
                                               ({"reward_range": [1, 1]}, "low < high"),
                                               ({"players": 3}, "players=3")])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TextArena(game="GuessTheNumber-v0", **kwargs)


def test_an_unknown_game_is_named_with_the_nearest():
    with pytest.raises(ValueError, match=r"^textarena: no game 'TicTacToo-v0'; did you mean TicTacToe-v0"):
        TextArena.check_args(game="TicTacToo-v0")
