"""The vocabulary of the synthetic note-search log: topics with their terms and query-only
synonyms, generic words, title / sentence / multi-topic templates, and the check that no word
is shared between topics."""

from __future__ import annotations

from dataclasses import dataclass

# Topic name | terms; "term:synonym" gives the synonym queries may use instead of
# the term (synonyms never appear in notes). One topic per line; an indented line
# continues the topic above it.
_TOPICS = """
coffee | espresso grinder:mill beans roast:roasting latte frother:steamer pourover filter kettle:boiler crema barista
    arabica decaf:decaffeinated aeropress caffeine mug:cup drip cappuccino
baking | sourdough starter:levain flour oven dough yeast loaf crust knead:kneading proofing:rising croissant butter
    pastry whisk:beater muffins cake:sponge frosting:icing baguette
gardening | tomatoes seedlings:sprouts compost soil:dirt mulch fertilizer:manure pruning:lopping shears:clippers raised
    weeds watering:irrigation perennials trowel:spade greenhouse aphids:greenfly herbs zucchini:courgette
houseplants | monstera pothos succulents repotting:transplanting humidity:moisture terracotta fern drainage overwatering
    cuttings propagation sunlight:daylight fiddle orchid cactus:cacti philodendron
hiking | trail:path boots:footwear backpack:rucksack summit:peak elevation switchbacks blisters trekking poles map
    compass waterproof ridge trailhead canteen:flask altitude:height
camping | tent campfire:bonfire stove lantern tarp:groundsheet hammock cooler:icebox firewood campsite:campground
    marshmallows repellent mosquitoes:bugs headlamp:flashlight axe:hatchet kindling cot
running | marathon sneakers:trainers pace tempo intervals shins:shinsplints stride endurance:stamina treadmill
    race:competition medal hydration:electrolytes jogging splits foam roller:massager
cycling | bicycle:bike gears chain saddle:seat helmet pedals derailleur tires:tyres brakes commute spokes
    handlebars:bars peloton puncture:flat cleats
yoga | poses:postures mat vinyasa pranayama flexibility:suppleness hamstrings balance namaste chakra bolster savasana
    hatha blocks strap
meditation | mindfulness:awareness breath:breathing mantra calm anxiety:worry focus:concentration retreat cushion:zafu
    timer journaling:diary gratitude:thankfulness stillness insight visualization silence compassion
sleep | insomnia:sleeplessness pillow mattress:bed melatonin naps:siestas bedtime circadian snoring dreams blackout
    alarm:clock drowsy:sleepy duvet:comforter earplugs eyemask
personal finance | budget spreadsheet:excel savings debt:loans retirement pension index funds stocks:equities dividends
    mortgage:homeloan taxes credit emergency interest:apr compound frugal:thrifty
cooking | pasta:spaghetti garlic onions skillet:pan simmer broth:bouillon chicken marinade spices:seasoning noodles wok
    curry casserole leftovers cilantro:coriander lentils
photography | camera lens:optics aperture shutter exposure tripod:stand headshots bokeh iso lightroom editing:retouching
    zoom:telephoto flash:strobe composition mirrorless sensor megapixels
travel | flights:airfare luggage:baggage passport itinerary hostel:dorm visa layover:stopover souvenirs:keepsakes jetlag
    currency:forex sightseeing:touring airport railway:train guidebook tourists:visitors
dogs | puppy:pup leash:lead kibble crate vet:veterinarian fetch treats:snacks groomer harness barking:yapping retriever
    terrier collar obedience:training kennel:doghouse
cats | kitten:kitty litter:litterbox scratcher:scratchpost catnip whiskers hairballs:furballs purring tabby siamese
    meowing:yowling laser neutering perch:cattree declawing
aquariums | aquarium:fishtank guppies betta cichlids gravel:substrate algae heater ammonia nitrates aquascape
    shrimp:prawns snails driftwood tetras siphon:vacuum
woodworking | chisel lathe dovetail joinery walnut oak plywood sandpaper:abrasive bandsaw jigsaw clamps:vises
    varnish:lacquer workbench:bench glue:adhesive mortise tenon
knitting | yarn:wool needles stitches scarf sweater:jumper mittens:gloves purl crochet skein gauge cardigan beanie:toque
    blanket:throw merino
painting | watercolor:watercolour acrylic canvas brushes palette easel pigments:paints gouache sketchbook:sketchpad
    portrait impasto mural:fresco landscapes:scenery
guitar | chords strings fretboard capo amplifier:amp plectrum:pick strumming tuning:tuner riffs:licks acoustic
    pedalboard fingerstyle barre tabs:tablature frets
music production | daw mixing:mixdown mastering synthesizer:synth drums:percussion beats:instrumentals midi compressor
    reverb equalizer:eq vocals:singing microphone:mic monitors:speakers plugins:vst studio
language learning | vocabulary:vocab grammar flashcards pronunciation conjugation fluency immersion spanish japanese
    duolingo tutor:teacher kanji verbs dictionary:lexicon listening:comprehension
chess | openings gambit endgame:endings checkmate:mate rook bishop knight pawn castling blitz tactics:combinations
    rating:elo puzzles sicilian grandmaster:gm stalemate
video games | console controller:gamepad multiplayer:online rpg quest:mission speedrun shooter:fps graphics:visuals boss
    dungeon loot headset:headphones mods:modding indie steam
board games | dice meeples deck:cards cooperative:coop catan scrabble monopoly expansion:addon rulebook:manual tabletop
    miniatures:minis wargames playtesting sleeves
astronomy | telescope:scope planets nebula galaxy:milkyway constellations eclipse meteor saturn jupiter orbit
    stargazing:skywatching observatory eyepiece:ocular comet
birdwatching | binoculars:binos feeder:birdfeeder warbler sparrow robin hummingbird owls migration nesting
    plumage:feathers birdsong:chirping heron woodpecker suet birdhouse:nestbox
wine | merlot cabernet vineyard:winery sommelier:somm tannins decanter:carafe corkscrew:opener vintage pinot chardonnay
    cellar riesling prosecco:bubbly
tea | matcha oolong teapot sencha chai:masala steeping:infusing teabags:sachets chamomile jasmine puerh infuser:strainer
    darjeeling kombucha
skincare | moisturizer:moisturiser sunscreen:spf serum retinol:retinoid cleanser:facewash acne:breakouts exfoliating
    toner pores hyaluronic niacinamide wrinkles:aging eczema dermatologist:derm
hair care | shampoo conditioner curls frizz:flyaways haircut:trim dandruff:flakes braids:plaits dye:coloring keratin
    scalp blowdryer:hairdryer straightener:flatiron bangs:fringe ponytail
fashion | jeans:denim blazer wardrobe:closet thrift:secondhand outfit:ensemble dress:gown accessories
    tailoring:alterations handbag:purse loafers:moccasins capsule linen hemline
home repair | drywall plumbing faucet:tap caulk:sealant toilet:loo wrench:spanner drill outlets:sockets breaker:fusebox
    insulation roof gutters:eaves spackle hinge grout
interior design | sofa:couch rug:carpet curtains:drapes lighting:lamps decor bookshelf:bookcase armchair wallpaper
    minimalist ottoman:footstool mirrors scandinavian
wedding planning | venue bride groom bridesmaids florist:flowers reception:banquet caterer invitations:invites
    photographer honeymoon vows engagement registry:giftlist tuxedo:tux
job hunting | resume:cv interviewer recruiter:headhunter salary:wage negotiation linkedin promotion internship:placement
    networking layoffs:redundancy references
parenting | toddler newborn:infant diapers:nappies tantrums:meltdowns stroller:pram daycare:nursery breastfeeding
    teething potty pacifier:dummy babysitter:nanny playground
fitness | dumbbells:weights barbell squats deadlift protein:whey reps:repetitions kettlebell biceps pushups:pressups
    plank creatine cardio:aerobic spotter hypertrophy:gains
nutrition | calories:kcal vegan:plantbased keto carbs:carbohydrates fasting vitamins fiber:fibre smoothie:shake salad
    macros sugar:sweets cholesterol supplements quinoa
car maintenance | engine:motor battery transmission:gearbox radiator coolant:antifreeze mechanic:garage sparkplugs
    alternator windshield:windscreen wipers mileage muffler:silencer dashboard:dash inspection
gadgets | smartphone:phone charger:adapter laptop:ultrabook earbuds:earphones tablet:ipad firmware bluetooth
    router:modem wifi:wireless smartwatch:wearable keyboard chromebook
programming | python javascript debugger compiler git repository:repo database:db framework terminal:shell
    refactoring:cleanup algorithm:algo recursion docker syntax
fishing | rod:pole reel lures:spoons bait hook trout bass tackle salmon pier:jetty waders angler:fisherman
skiing | skis snowboard slopes:pistes chairlift:lift goggles bindings powder:freshies avalanche resort moguls:bumps
    gondola:cablecar
beekeeping | hive:beehive bees honey queen swarm smoker varroa:mites comb:honeycomb beeswax beekeeper:apiarist pollen
    nectar drones
pottery | clay wheel glaze kiln ceramics bowls vase:urn trimming centering stoneware porcelain:china handbuilding firing
climbing | bouldering chalk crimps belay carabiner:biner rope crag:cliff rappel:abseil overhang quickdraws:draws
movies | director:filmmaker sequel trailer:teaser screenplay:script cinema:theater documentary streaming popcorn
    actors:cast oscars thriller horror animation:cartoons
reading | novel:book paperback:softcover kindle:ereader library audiobook author:writer chapters bookclub fiction
    memoir:autobiography poetry:poems bestseller bookmark annotations
"""

ADJECTIVES = (
    "great",
    "terrible",
    "cheap",
    "expensive",
    "simple",
    "tricky",
    "underrated",
    "overrated",
    "sturdy",
    "solid",
    "fantastic",
    "disappointing",
    "reliable",
    "messy",
    "quick",
    "slow",
    "surprising",
    "perfect",
)
TIMES = ("today", "yesterday", "last week", "this month", "every morning", "on weekends", "after work", "all summer")
VERBS = (
    "tried",
    "bought",
    "tested",
    "switched to",
    "cleaned",
    "fixed",
    "compared",
    "started with",
    "upgraded",
    "learned about",
)
FILLERS = (
    "Honestly it took a while to get used to it.",
    "Would recommend to anyone starting out.",
    "Saving this note for later.",
    "Let me know what works for you.",
    "Still figuring things out.",
    "Small changes really add up.",
    "Not sponsored, just sharing.",
    "Happy with the result so far.",
)
TITLE_TEMPLATES = (
    "{A} and {b}: my {adj} experience",
    "{A} {b} notes",
    "How I use my {a} with {b}",
    "{A} tips for {b}",
    "My {adj} guide to {a} and {b}",
    "{A} vs {b}: what I learned",
    "Lessons from {a} and {b}",
    "{A}, {b} and {c}",
    "A {adj} week of {a}",
    "Why {a} changed my {b} routine",
)
SENTENCE_TEMPLATES = (
    "{time} I {verb} a new {a} and the {b} felt {adj}.",
    "The {a} made a huge difference for my {b}.",
    "My advice: never skip the {a} when you work on the {b}.",
    "{A} is {adj}, but the {b} is what really matters.",
    "After a week the {a} still looks {adj}.",
    "If you are new to {topic}, start with a simple {a}.",
    "Honestly the {a} was {adj} and the {b} even more so.",
    "I keep a small notebook about {a} and {b}.",
    "People asked about my {a}, so here is everything about it.",
    "{A} plus {b} is my {adj} combination for {topic}.",
    "Do not overthink the {a}; the {b} matters more.",
    "I compared three kinds of {a} {time}.",
)
QUERY_TEMPLATES_1 = (
    "{a}",
    "best {a}",
    "{a} tips",
    "how to choose {a}",
    "{a} for beginners",
    "cheap {a}",
    "{a} problems",
)
QUERY_TEMPLATES_2 = (
    "{a} {b}",
    "best {a} for {b}",
    "{a} {b} tips",
    "{a} with {b}",
    "{a} vs {b}",
    "how to use {a} with {b}",
    "{a} and {b} for beginners",
    "{a} {b} guide",
    "{a} {b} problems",
)
QUERY_TEMPLATES_3 = ("{a} {b} {c}", "{a} {b} and {c}", "best {a} {b} {c}", "{a} with {b} and {c} tips")
MULTI_TEMPLATES = ("{a} and {b}", "{a} plus {b}", "{a} while {b}", "{a} {b} ideas", "combining {a} and {b}")


@dataclass(frozen=True)
class Topic:
    name: str
    terms: tuple[str, ...]
    synonyms: dict[str, str]  # term -> synonym used only in queries


def _topic_lines() -> list[str]:
    """One ``name | terms`` line per topic, indented continuation lines joined on."""
    lines: list[str] = []
    for raw in _TOPICS.strip().splitlines():
        if raw[:1].isspace() and lines:
            lines[-1] += " " + raw.strip()
        else:
            lines.append(raw)
    return lines


def topics() -> list[Topic]:
    """The built-in topic vocabularies (validated: no term or synonym is shared)."""
    out = []
    for line in _topic_lines():
        name, terms = (p.strip() for p in line.split("|"))
        ts, syn = [], {}
        for tok in terms.split():
            t, _, s = tok.partition(":")
            ts.append(t)
            if s:
                syn[t] = s
        out.append(Topic(name, tuple(ts), syn))
    return out


def check_vocabulary(tps: list[Topic] | None = None) -> None:
    """Raise ValueError if a term, synonym or generic word is used twice (which would
    blur topics or leak synonyms into notes)."""
    import re

    tps = tps or topics()
    owner: dict[str, str] = {}
    generic_text = " ".join(ADJECTIVES + TIMES + VERBS + FILLERS + TITLE_TEMPLATES + SENTENCE_TEMPLATES)
    generic_text += " " + " ".join(QUERY_TEMPLATES_1 + QUERY_TEMPLATES_2 + QUERY_TEMPLATES_3 + MULTI_TEMPLATES)
    generic = set(re.findall(r"[a-z]+", re.sub(r"\{[a-zA-Z]+\}", " ", generic_text).lower()))
    topic_words = {w for t in tps for w in t.name.split()}
    for t in tps:
        for w in list(t.terms) + list(t.synonyms.values()):
            if w in owner:
                raise ValueError(f"word {w!r} used by topics {owner[w]!r} and {t.name!r}")
            owner[w] = t.name
            if w in generic:
                raise ValueError(f"topic word {w!r} ({t.name}) also appears in the generic templates")
            if w in topic_words:
                raise ValueError(f"topic word {w!r} ({t.name}) is also part of a topic name")
