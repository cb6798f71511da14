"""Prompt text for the built-in workloads: Shakespeare (public domain), like the embedded model.

The embedded model was trained on Shakespeare's works, so prompts in its style make it write
recognisable verse. Short openings feed the steady and burst workloads; whole speeches, glued
together, make the long prompts that need chunked prefill; a fixed "system prompt" shared by
many requests shows the prefix cache at work.
"""

from __future__ import annotations

OPENINGS: tuple[str, ...] = (
    "ROMEO:\nBut soft, what light through yonder window breaks?",
    "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?",
    "HAMLET:\nTo be, or not to be, that is the question:",
    "MACBETH:\nIs this a dagger which I see before me,",
    "KING RICHARD III:\nNow is the winter of our discontent",
    "PORTIA:\nThe quality of mercy is not strain'd;",
    "JAQUES:\nAll the world's a stage,",
    "MARK ANTONY:\nFriends, Romans, countrymen, lend me your ears;",
    "PROSPERO:\nOur revels now are ended. These our actors,",
    "KING HENRY V:\nOnce more unto the breach, dear friends, once more;",
    "LADY MACBETH:\nOut, damned spot! out, I say!",
    "OTHELLO:\nIt is the cause, it is the cause, my soul;",
    "VIOLA:\nI left no ring with her: what means this lady?",
    "KING LEAR:\nBlow, winds, and crack your cheeks! rage! blow!",
    "PUCK:\nIf we shadows have offended,",
    "FIRST CITIZEN:\nBefore we proceed any further, hear me speak.",
)

SPEECHES: tuple[str, ...] = (
    "HAMLET:\nTo be, or not to be, that is the question:\n"
    "Whether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\n"
    "Or to take arms against a sea of troubles\n"
    "And by opposing end them. To die: to sleep;\n"
    "No more; and by a sleep to say we end\n"
    "The heart-ache and the thousand natural shocks\n"
    "That flesh is heir to, 'tis a consummation\n"
    "Devoutly to be wish'd. To die, to sleep;\n"
    "To sleep: perchance to dream: ay, there's the rub;\n"
    "For in that sleep of death what dreams may come\n"
    "When we have shuffled off this mortal coil,\n"
    "Must give us pause: there's the respect\n"
    "That makes calamity of so long life;\n",
    "JAQUES:\nAll the world's a stage,\n"
    "And all the men and women merely players:\n"
    "They have their exits and their entrances;\n"
    "And one man in his time plays many parts,\n"
    "His acts being seven ages. At first the infant,\n"
    "Mewling and puking in the nurse's arms.\n"
    "And then the whining school-boy, with his satchel\n"
    "And shining morning face, creeping like snail\n"
    "Unwillingly to school. And then the lover,\n"
    "Sighing like furnace, with a woeful ballad\n"
    "Made to his mistress' eyebrow. Then a soldier,\n"
    "Full of strange oaths and bearded like the pard,\n"
    "Jealous in honour, sudden and quick in quarrel,\n"
    "Seeking the bubble reputation\n"
    "Even in the cannon's mouth.\n",
    "PORTIA:\nThe quality of mercy is not strain'd,\n"
    "It droppeth as the gentle rain from heaven\n"
    "Upon the place beneath: it is twice blest;\n"
    "It blesseth him that gives and him that takes:\n"
    "'Tis mightiest in the mightiest: it becomes\n"
    "The throned monarch better than his crown;\n"
    "His sceptre shows the force of temporal power,\n"
    "The attribute to awe and majesty,\n"
    "Wherein doth sit the dread and fear of kings;\n"
    "But mercy is above this sceptred sway;\n"
    "It is enthroned in the hearts of kings,\n"
    "It is an attribute to God himself;\n",
    "MACBETH:\nTo-morrow, and to-morrow, and to-morrow,\n"
    "Creeps in this petty pace from day to day\n"
    "To the last syllable of recorded time,\n"
    "And all our yesterdays have lighted fools\n"
    "The way to dusty death. Out, out, brief candle!\n"
    "Life's but a walking shadow, a poor player\n"
    "That struts and frets his hour upon the stage\n"
    "And then is heard no more: it is a tale\n"
    "Told by an idiot, full of sound and fury,\n"
    "Signifying nothing.\n",
    "KING HENRY V:\nOnce more unto the breach, dear friends, once more;\n"
    "Or close the wall up with our English dead.\n"
    "In peace there's nothing so becomes a man\n"
    "As modest stillness and humility:\n"
    "But when the blast of war blows in our ears,\n"
    "Then imitate the action of the tiger;\n"
    "Stiffen the sinews, summon up the blood,\n"
    "Disguise fair nature with hard-favour'd rage;\n"
    "Then lend the eye a terrible aspect;\n",
)

# Shared by every request of the prefix-caching workload: the "system prompt".
SYSTEM_PROMPT = (
    "CHORUS:\nTwo households, both alike in dignity,\n"
    "In fair Verona, where we lay our scene,\n"
    "From ancient grudge break to new mutiny,\n"
    "Where civil blood makes civil hands unclean.\n"
    "From forth the fatal loins of these two foes\n"
    "A pair of star-cross'd lovers take their life;\n"
)

# A second one, so two families of cached prefixes compete for the cache.
SYSTEM_PROMPT_2 = (
    "PROLOGUE:\nO for a Muse of fire, that would ascend\n"
    "The brightest heaven of invention,\n"
    "A kingdom for a stage, princes to act\n"
    "And monarchs to behold the swelling scene!\n"
)

QUESTIONS: tuple[str, ...] = (
    "\nROMEO:\n",
    "\nJULIET:\n",
    "\nMERCUTIO:\n",
    "\nNURSE:\n",
    "\nTYBALT:\n",
    "\nFRIAR LAURENCE:\n",
    "\nBENVOLIO:\n",
    "\nCAPULET:\n",
)
