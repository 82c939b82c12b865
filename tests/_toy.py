"""A small intent data set written out here, and a classifier fitted on it with the hashing encoder:
what the store and service tests need, in a fraction of a second and without any data set or model
download."""

from dyntc import DynamicClassifier

LABELS = ["alarm", "balance", "timer", "weather"]

TEXTS = {
    "alarm": ["wake me up at six", "set an alarm for 7 am", "alarm for tomorrow morning at five",
              "please wake me at 6:30", "i need an alarm at noon", "turn on my alarm for 8",
              "set a wake up alarm", "alarm at seven thirty please", "can you wake me up early",
              "make an alarm for 9 am"],
    "balance": ["what is my balance", "how much money do i have", "show my account balance",
                "what's left in my checking account", "tell me my savings balance", "how much is in my account",
                "check my bank balance", "balance of my credit card", "what is the balance on my account",
                "how much cash is in checking"],
    "timer": ["set a timer for ten minutes", "start a 5 minute timer", "timer for 30 seconds",
              "count down from one minute", "set a countdown for an hour", "start a timer for the pasta",
              "timer for 20 minutes please", "begin a three minute timer", "how long is left on the timer",
              "cancel my timer"],
    "weather": ["what is the weather today", "will it rain tomorrow", "is it going to be sunny",
                "weather forecast for the weekend", "how hot will it be today", "do i need an umbrella",
                "is it cold outside", "what's the temperature outside", "will it snow this week",
                "forecast for tomorrow morning"],
}


def toy_classifier(**params) -> DynamicClassifier:
    """`DynamicClassifier(encoder="hashing", **params)` fitted on TEXTS."""
    texts = [t for label in LABELS for t in TEXTS[label]]
    labels = [label for label in LABELS for _ in TEXTS[label]]
    return DynamicClassifier(encoder="hashing", **params).fit(texts, labels)
