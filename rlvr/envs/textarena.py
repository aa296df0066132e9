"""TextArena games (https://github.com/LeonGuertler/TextArena, ``textarena==0.7.4``) as rlvr environments (issue 42).

The model plays one seat of a game; the game's observations come as user messages, the model's replies are its
moves, the game decides the end and the reward. A two-player game's other seat is played by a fixed opponent
policy the recipe names (``opponent``), inside the environment's step, so one rlvr turn is one move of the model.

Mapping (textarena 0.7.4: ``textarena/core.py`` ``Env``/``State``, ``textarena/state.py``
``SinglePlayerState``/``TwoPlayerState``):

- ``reset(row)``: ``ta.make(game + "-raw", **game_args)`` (the ``-raw`` registration: no observation wrappers,
  whose ``__getattr__`` makes the game object fail to pickle, and whose history strings would repeat what rlvr's
  conversation already holds), ``reset(num_players, seed=row["seed"])``; the opponent moves first when the model
  plays seat 1; the opening is the model's observations so far as one user message (after ``system_prompt``, if
  given).
- ``step(reply)``: ``env.step(reply text)``; then, while the game is on and another seat is to move, the opponent
  moves; then the model's new observations (its own move's echo left out, another player's move shown as
  ``[Player N] move``, the game's messages as they are) are the next user message. A finished game
  (``state.done``) ends the trajectory with the reward ``env.close()`` gives the model's seat, mapped from
  ``reward_range`` (default ``[-1, 1]``, TextArena's win/loss) onto [0, 1], clipped.
- Invalid moves: the game's own handling (``set_invalid_move``: a message naming the reason and another try, up to
  the game's ``error_allowance``, then the game is lost) reaches the model as that message; ``info`` counts them
  (``invalid_moves``) and the metrics show them as turns. A game that raises, or an opponent that does, ends the
  trajectory as an environment failure (``env: error: ...``), which rlvr leaves out of the update.
- Randomness: TextArena draws from Python's global ``random`` (seeded by ``reset``'s seed), also during a game
  (cards, dice). The environment saves that generator's state after each call and restores it before the next,
  so a game is the same whichever worker takes its next step (rlvr pickles environments between calls).

Which games work offline (probed 2026-12-05 by making, resetting and pickling each ``-raw`` registration:
``benchmarks/textarena_games.py``): 167 of 237. Refused, with the reason, by :meth:`TextArena.check_args`: games that
download nltk's word lists (Wordle, Hangman, WordLadder, WordSearch, SpellingBee, Codenames, DontSayIt,
LetterAuction, WordChains), call an LLM through OpenRouter (Debate, TwentyQuestions, GuessWho,
ScenarioPlanning), need three or more players (Taboo, SecretMafia, CharacterConclave, SettlersOfCatan, the
ThreePlayer* games), need data files the wheel lacks (ScorableGames, UsedCarNegotiation), or fail to import on
Python 3.11 (Chess, Checkers, Klondike, ReverseTicTacToe, IteratedStagHunt, UltimateTexasHoldem: nested f-string
quotes, a 3.12 feature).
"""

from __future__ import annotations

import importlib
import pickle
import random
from typing import Any, Callable

from rlvr.envs.base import BadEnvOutput, EnvStep
from rlvr.envs.tokens import Message
from rlvr.seeding import opponent_seed

MAX_OPPONENT_MOVES = 1000
"""Opponent moves in a row after one model move at most (a game that never hands the turn back is a bug)."""


class TextArenaError(RuntimeError):
    """A game or its opponent could not be set up or played."""


def _make(game: str, game_args: dict[str, Any]) -> Any:
    try:
        import textarena as ta
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError as e:
        raise ImportError(f"the textarena environment needs textarena: pip install 'rlvr[envs]' (or "
                          f"textarena==0.7.4) ({e})") from e  # fmt: skip
    if ":" in game:  # a game of your own: a textarena.Env subclass
        return _game_class(game)(**game_args)
    raw = game if game.endswith("-raw") else f"{game}-raw"
    if raw not in ENV_REGISTRY:
        import difflib

        games = sorted(g[: -len("-raw")] for g in ENV_REGISTRY if g.endswith("-raw"))
        near = difflib.get_close_matches(game, games, n=3)
        raise ValueError(f"textarena: no game {game!r}" + (f"; did you mean {', '.join(near)}?" if near else
                                                          f" ({len(games)} games: textarena.envs.registration)"))
    return ta.make(env_id=raw, **game_args)


def _game_class(game: str) -> Any:
    """The ``textarena.Env`` subclass ``game`` (``module:Class`` or ``path/file.py:Class``) names, its module
    imported. Errors: ``ValueError`` when it is not one; those of importing it."""
    import textarena as ta

    from rlvr.userfiles import is_file_target, load_file

    target, _, attr = game.rpartition(":")
    module = load_file(target, "game") if is_file_target(game) else importlib.import_module(target)
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, ta.Env)):
        raise ValueError(f"textarena: game={game!r} is not a textarena.Env subclass")
    return cls


def _opponent(spec: str | None) -> Callable[[str, random.Random], str] | None:
    """The opponent policy ``spec`` names: ``always:<move>``, ``random:<move>|<move>|...`` (uniform, from the
    trajectory's own generator), or ``module:function`` / ``path/file.py:function`` (``function(observation:
    str) -> str``). None: no opponent. Errors: ``ValueError`` for an empty list, ``ImportError``/
    ``AttributeError`` for a target that does not resolve."""
    if spec is None:
        return None
    kind, _, rest = spec.partition(":")
    if kind == "always":
        return lambda obs, rng: rest
    if kind == "random":
        moves = [m for m in rest.split("|") if m]
        if not moves:
            raise ValueError(f"textarena: opponent={spec!r} lists no moves; e.g. random:[rock]|[paper]|[scissors]")
        return lambda obs, rng: rng.choice(moves)
    from rlvr.userfiles import is_file_target, load_file

    target, _, attr = spec.rpartition(":")
    if not target:
        raise ValueError(f"textarena: opponent={spec!r}; use always:<move>, random:<a>|<b>, or module:function")
    module = load_file(target, "opponent") if is_file_target(spec) else importlib.import_module(target)
    fn = getattr(module, attr)
    return lambda obs, rng: fn(obs)


def _text(observations: list[tuple[int, str, Any]], me: int) -> str:
    """One user message from a seat's observations: the game's messages (and the game's account of the seat's own
    play) as they are, another player's as ``[Player N] message``; the seat's own move echoed back is left out (the
    conversation holds it)."""
    import textarena as ta

    parts = []
    for sender, message, kind in observations:
        if sender == me and kind == ta.ObservationType.PLAYER_ACTION:
            continue
        parts.append(message if sender in (me, ta.GAME_ID) else f"[Player {sender}] {message}")
    return "\n".join(p for p in parts if p.strip())


class TextArena:
    """A TextArena game as an rlvr environment (the module docstring).

    ``game``: a TextArena id (``TicTacToe-v0``, ``GuessTheNumber-v0``; its ``-raw`` registration is played), or a
    game of your own, a ``textarena.Env`` subclass (``module:Class`` or ``path/file.py:Class``);
    ``game_args``: keyword arguments of the game's constructor (``{num_rounds: 3}``); ``players``: seats
    (1 or 2); ``seat``: the model's seat (0 moves first); ``opponent``: the policy of the other seat of a two-player
    game (``always:[rock]``, ``random:[rock]|[paper]|[scissors]``, ``module:function``); ``reward_range``: the
    game's rewards ``[low, high]`` mapped linearly onto [0, 1]; ``system_prompt``: a system message before the
    opening (None: none).

    Each row gives the game's seed as ``seed`` (:meth:`rows` makes such rows).

    Errors: ``ValueError`` for bad arguments (at load: :meth:`check_args`); :class:`TextArenaError` for an
    opponent that does not answer with a string or a game that never hands the turn back."""

    preload_modules = ("textarena",)
    """Imported by each environment worker as it starts (:class:`rlvr.envs.pool.EnvPool`)."""

    def __init__(self, game: str, game_args: dict[str, Any] | None = None, players: int = 1, seat: int = 0,
                 opponent: str | None = None, reward_range: list[float] | None = None,
                 system_prompt: str | None = None) -> None:
        if players not in (1, 2):
            raise ValueError(f"textarena: players={players!r}; 1 or 2 (games of 3 or more are not supported)")
        if not 0 <= seat < players:
            raise ValueError(f"textarena: seat={seat!r}; 0 .. players - 1")
        if players == 2 and opponent is None:
            raise ValueError("textarena: a two-player game needs opponent: always:<move>, random:<a>|<b>, or "
                             "module:function (the policy that plays the other seat)")
        lo, hi = reward_range if reward_range is not None else (-1.0, 1.0)
        if not lo < hi:
            raise ValueError(f"textarena: reward_range={reward_range!r}; give [low, high] with low < high")
        self.game, self.game_args = game, dict(game_args or {})
        self.players, self.seat, self.opponent_spec = players, seat, opponent
        self.reward_range, self.system_prompt = (float(lo), float(hi)), system_prompt
        self.env: Any = None
        self.rng_state: Any = None
        self.opponent_rng = random.Random(0)
        self.invalid_moves = 0
        self.moves = 0

    @staticmethod
    def check_args(game: str, game_args: dict[str, Any] | None = None, players: int = 1, seat: int = 0,
                   opponent: str | None = None, **_: Any) -> None:
        """Load-time check: the game exists, builds with ``game_args`` and resets for ``players`` offline; the
        opponent resolves. Errors: ``ValueError`` naming what failed and why (a word list to download, an API
        key, a player count)."""
        state = random.getstate()
        try:
            env = _make(game, dict(game_args or {}))
            env.reset(num_players=players, seed=0)
        except LookupError as e:
            raise ValueError(f"textarena: {game} needs nltk data this machine does not have (it downloads word "
                             f"lists): {str(e).split(chr(10))[0] or e}; pick a game that works offline") from None
        except (ValueError, ImportError) as e:
            if str(e).startswith("textarena:") or isinstance(e, ImportError):
                raise
            raise ValueError(f"textarena: {game} with players={players} did not reset: {type(e).__name__}: {e}") from e
        except Exception as e:  # noqa: BLE001 - the game's own reason, named
            raise ValueError(f"textarena: {game} with players={players} did not reset: {type(e).__name__}: {e}") from e
        finally:
            random.setstate(state)
        _opponent(opponent)

    @classmethod
    def rows(cls, size: int, seed: int) -> list[dict[str, Any]]:
        """``size`` rows, each one game's seed: ``{"question": "", "seed": s}`` with s drawn from ``seed`` (the same
        rows for the same seed; another seed, other games: ``rlvr eval RUN --seed N`` plays held-out seeds)."""
        rng = random.Random(seed)
        return [{"question": "", "seed": rng.randrange(2**31)} for _ in range(size)]

    def __getstate__(self) -> dict[str, Any]:
        # the game pickled on its own, so that __setstate__ can import a game of your own (module:Class, a file's
        # module) before unpickling it: a worker that never made this game may take its next step
        return {**self.__dict__, "env": pickle.dumps(self.env)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if ":" in state["game"]:
            _game_class(state["game"])
        self.__dict__.update(state, env=pickle.loads(state["env"]))

    # -- the game ---------------------------------------------------------------------------------------------
    def _restore(self) -> None:
        if self.rng_state is not None:
            random.setstate(self.rng_state)

    def _save(self) -> None:
        self.rng_state = random.getstate()

    def _opponent_moves(self) -> None:
        policy = _opponent(self.opponent_spec)
        for _ in range(MAX_OPPONENT_MOVES):
            if self.env.state.done or self.env.state.current_player_id == self.seat:
                return
            pid, obs = self.env.get_observation()
            move = policy(_text(obs, pid), self.opponent_rng) if policy is not None else None
            if not isinstance(move, str):
                raise TextArenaError(f"textarena: the opponent {self.opponent_spec!r} answered {move!r}, not a move")
            self.env.step(move)
        raise TextArenaError(f"textarena: {self.game}: the opponent moved {MAX_OPPONENT_MOVES} times in a row")

    def _end(self) -> EnvStep:
        rewards, game_info = self.env.close() if callable(getattr(self.env, "close", None)) else (None, {})
        given = (rewards or {}).get(self.seat, self.reward_range[0])
        if isinstance(given, bool) or not isinstance(given, (int, float)):
            raise BadEnvOutput(f"textarena: {self.game} ended with the reward {given!r} for seat {self.seat}, not a "
                               "number")
        raw = float(given)
        lo, hi = self.reward_range
        reward = min(1.0, max(0.0, (raw - lo) / (hi - lo)))
        info = (game_info or {}).get(self.seat, {}) if isinstance(game_info, dict) else {}
        return EnvStep([], reward=reward, done=True,
                       info={"game_reward": raw, "reason": str(info.get("reason", ""))[:300],
                             "invalid_moves": self.invalid_moves, "moves": self.moves})

    def reset(self, row: dict[str, Any]) -> list[Message] | None:
        if "seed" not in row:
            raise ValueError("textarena: the row has no 'seed' (use data.source: env:textarena, or give each row "
                             "a seed field)")
        seed = int(row["seed"])
        saved = random.getstate()
        try:
            self.env = _make(self.game, self.game_args)
            self.env.reset(num_players=self.players, seed=seed)
            self.opponent_rng = random.Random(opponent_seed(seed))
            self.invalid_moves = self.moves = 0
            self._opponent_moves()
            pid, obs = self.env.get_observation()
            self._save()
        finally:
            random.setstate(saved)
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return opening + [{"role": "user", "content": _text(obs, self.seat)}]

    def step(self, history: list[Message], reply: Message) -> EnvStep:
        saved = random.getstate()
        try:
            self._restore()
            before = getattr(self.env.state, "error_count", 0)
            self.env.step(reply["content"])
            self.moves += 1
            lost_on_it = self.env.state.done and bool((self.env.state.game_info.get(self.seat) or {}).get("invalid_move"))
            if getattr(self.env.state, "error_count", 0) > before or lost_on_it:
                self.invalid_moves += 1
            if not self.env.state.done:
                self._opponent_moves()
            if self.env.state.done:
                return self._end()
            pid, obs = self.env.get_observation()
            self._save()
        finally:
            random.setstate(saved)
        text = _text(obs, self.seat) or "(no new observation) Your move."
        return EnvStep([{"role": "user", "content": text}], reward=None, done=False,
                       info={"invalid_moves": self.invalid_moves, "moves": self.moves})
